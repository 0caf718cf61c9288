"""The ``allow`` setting on a sandbox the plugin resumes: applied, kept or warned about, never silently.

The plugin gives a new sandbox the configured egress allow-list. A persistent sandbox outlives its
session, and by the next one its list may differ from the setting for two reasons: the user edited
the setting, or changed the sandbox's list from a shell (``hermes-sandboxes network ...``,
``hermes sandbox network ...``). Overriding the live list would silently undo a deliberate shell
change; ignoring the setting would silently leave an edited setting without effect. So on resume,
for a sandbox with network ``proxy`` on a backend with an allow-list:

* the live list equals the configured one (as sets of entries): nothing to do;
* the live list is the one the plugin last applied, so only the setting changed: the configured list
  is applied (recorded like any change, in the journal and the audit log) and the session is told;
* otherwise somebody else changed the list since the plugin applied it (or the plugin never applied
  one: a sandbox the CLI made, or an older plugin): the live list is kept and a warning names both
  lists and how to settle it. It is given once per pair of lists (live, configured), not at every
  resume; settling it (either way) makes the lists equal, and the next difference warns again.

What the plugin last applied, and the pair it last warned about, are small files beside the
sandbox's journal (``<journal>.allow.applied``, ``<journal>.allow.warned``), read and written under
the allow-list lock that every change to the list takes (``RecordedSandbox.allow_lock``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
from collections.abc import Sequence
from pathlib import Path

from hermes_sandboxes.recorder.sandbox import RecordedSandbox
from hermes_sandboxes.sandbox import Capability, SandboxSpec

logger = logging.getLogger(__name__)


def _key(entries: Sequence[str]) -> list[str]:
    """The list as a set of entries, compared as ``policy.edited`` does (no case, no spaces)."""
    return sorted({e.strip().lower() for e in entries})


def _shown(entries: Sequence[str]) -> str:
    return " ".join(entries) or "(nothing)"


class _Files:
    """The plugin's memory of one sandbox's list, beside its journal."""

    def __init__(self, recorded: RecordedSandbox) -> None:
        journal = recorded.journal.path
        self.applied = journal.with_name(journal.name + ".allow.applied")
        self.warned = journal.with_name(journal.name + ".allow.warned")

    @staticmethod
    def read(path: Path) -> object:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None  # never written (or unreadable): nothing is known

    @staticmethod
    def write(path: Path, value: object) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        temp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        temp.write_text(json.dumps(value))
        os.replace(temp, path)

    def remember_applied(self, entries: Sequence[str]) -> None:
        self.write(self.applied, _key(entries))
        with contextlib.suppress(FileNotFoundError):
            self.warned.unlink()


def remember_created(recorded: RecordedSandbox, wanted: SandboxSpec) -> None:
    """The plugin just created ``recorded`` from ``wanted`` (the settings' spec)."""
    if _applies(recorded, wanted):
        with recorded.allow_lock():
            _Files(recorded).remember_applied(wanted.allow)


def _applies(recorded: RecordedSandbox, wanted: SandboxSpec) -> bool:
    """Only an allow-list the settings ask for (network ``proxy``) on a backend that has one."""
    return wanted.network == "proxy" and Capability.EGRESS_ALLOWLIST in recorded.inner.backend.capabilities


def reconcile(recorded: RecordedSandbox, wanted: SandboxSpec) -> str:
    """Bring a resumed sandbox's list in line with the settings' (``wanted.allow``) where that
    undoes nobody's change (see the module's rules); returns what the session should be told ("" for
    nothing)."""
    if not _applies(recorded, wanted):
        return ""
    configured, files = wanted.allow, _Files(recorded)
    with recorded.allow_lock():
        spec = recorded.inner.info().spec
        if spec.network != "proxy":
            return ""  # the network mode is chosen at creation; nothing here can change it
        live, asked = _key(spec.allow), _key(configured)
        if live == asked:
            if files.read(files.applied) != live or files.warned.exists():  # settled: remember it (once)
                files.remember_applied(configured)
            return ""
        if files.read(files.applied) == live:
            recorded.set_allow(configured, previous=spec.allow)
            files.remember_applied(configured)
            note = (f"sandbox {recorded.name}: the allow setting changed since this sandbox was last given it; "
                    f"its egress allow-list is now {_shown(configured)} (was {_shown(spec.allow)})")
            logger.info("%s", note)
            return note
        if files.read(files.warned) == [live, asked]:
            return ""  # said once already: the user knows
        files.write(files.warned, [live, asked])
    note = (f"sandbox {recorded.name}: its egress allow-list was changed outside this plugin's settings and "
            f"is kept as it is: {_shown(spec.allow)}; the allow setting says {_shown(configured)}. To use the "
            f"setting, run `hermes sandbox network set {' '.join(shlex.quote(e) for e in configured)} --sandbox "
            f"{recorded.name}`; to keep the change, put it in the allow setting")
    logger.warning("%s", note)
    return note
