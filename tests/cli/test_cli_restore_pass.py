"""One ``checkpoint restore`` is one pass: the backend lists the checkpoints once, the journal is
read once (settling what dead processes left open from the same reading), the diff is taken and
summarised once, and the preview it showed is what the restore records.

Counted with a real counting backend and host state (tests/contract/counting.py), on the local
backend."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from hermes_sandboxes.backends.local import LocalBackend
from hermes_sandboxes.cli.commands import checkpoints
from hermes_sandboxes.cli.session import Workspace
from hermes_sandboxes.names import unique_name
from hermes_sandboxes.recorder.journal import RestoreRecord
from tests.contract.counting import CountingBackend, CountingState


def test_one_cli_restore_lists_the_checkpoints_once_and_reads_the_journal_once(
        local_backend: LocalBackend, tmp_path: Path) -> None:
    backend = CountingBackend(local_backend)
    state = CountingState(tmp_path / "state")
    name = unique_name("rp")
    sandbox = backend.create(name)
    try:
        recorded = state.recorded(sandbox)
        target = recorded.checkpoint("before").id
        for i in range(3):
            recorded.exec(f"echo {i} > /root/f{i}")
        recorded.close()
        workspace = Workspace(state=state)
        workspace.use(backend)
        backend.calls.clear()
        state.reads.clear()

        result = CliRunner().invoke(checkpoints.checkpoint, ["restore", name, target, "--yes"], obj=workspace)

        assert result.exit_code == 0, result.output
        assert "echo 2 > /root/f2" in result.output  # the preview showed what it throws away
        assert backend.calls["checkpoints"] == 1
        assert backend.calls["diff"] == 1
        assert backend.calls["restore"] == 1
        assert sum(state.reads.values()) == 1, state.reads  # the sandbox's journal, once; the audit log never
        assert state.reads[f"{name}.jsonl"] == 1
        [restored] = state.journal(backend, name).records_of(RestoreRecord)
        assert (restored.id, restored.discarded) == (target, 3)
    finally:
        sandbox.destroy()
