"""``hermes_sandboxes.record(sandbox)``, the Python API's way to wrap a sandbox: journaled under the
host state directory, with the hooks every face passes, so a restore through it is noted for Hermes
sessions on this host and Hermes's housekeeping is recorded as such."""

from __future__ import annotations

import os
from pathlib import Path

import hermes_sandboxes
from hermes_sandboxes.hermes.sync import restores
from hermes_sandboxes.recorder.records import ExecRecord
from hermes_sandboxes.sandbox import Sandbox


def test_record_notes_a_restore_for_hermes_sessions_and_knows_their_housekeeping(sandbox: Sandbox) -> None:
    recorded = hermes_sandboxes.record(sandbox)
    try:
        assert recorded.journal.path.is_relative_to(Path(os.environ["HERMES_SANDBOXES_STATE"]))
        taken = recorded.checkpoint("before")
        assert recorded.exec("sha256sum '/root/x' 2>/dev/null").verdict.internal is None  # (policy off: no verdict)
        [housekeeping] = recorded.journal.records_of(ExecRecord)
        assert housekeeping.internal  # ...but recorded as Hermes's own by the hooks
        assert restores.noted(recorded.journal.path) == ""
        recorded.restore(taken.id)
        assert recorded.restore_token and restores.noted(recorded.journal.path) == recorded.restore_token
    finally:
        recorded.close()
