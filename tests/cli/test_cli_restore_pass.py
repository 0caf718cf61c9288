"""One restore is one pass, and a confirmed one takes no diff at all.

A ``checkpoint restore --yes`` lists the checkpoints once and reads the journal once (settling what
dead processes left open from the same reading), and the commands it showed are what the restore
records. Every confirmed undo (the CLI's ``--yes``, the Python API's ``restore``, MCP's
``checkpoint_restore`` with ``confirm: true``, Hermes's ``/sandbox undo ID --yes``) computes no
diff: a tree made to be slow to compare must not hold rollback back (issue 24, finding 4). The
previews that ask (MCP without confirm, ``/sandbox undo`` without ``--yes``) diff once.

Counted with a real counting backend and host state (tests/contract/counting.py), on the local
backend."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from mcp import Client

from hermes_sandboxes import backends
from hermes_sandboxes.backends.local import LocalBackend
from hermes_sandboxes.cli.commands import checkpoints
from hermes_sandboxes.cli.owners import Owners
from hermes_sandboxes.cli.session import Workspace
from hermes_sandboxes.hermes import slash
from hermes_sandboxes.hermes.conversation import Target, take_note
from hermes_sandboxes.hermes.providers.local import LocalProvider
from hermes_sandboxes.mcp.scope import Host, Rules
from hermes_sandboxes.mcp.server import build
from hermes_sandboxes.names import unique_name
from hermes_sandboxes.recorder.journal import RestoreRecord
from hermes_sandboxes.recorder.sandbox import RecordedSandbox
from hermes_sandboxes.sandbox import Sandbox
from tests.contract.counting import CountingBackend, CountingState
from tests.mcp.kit import InProcess, call_ok, drive


@pytest.fixture
def counted(local_backend: LocalBackend) -> CountingBackend:
    return CountingBackend(local_backend)


@pytest.fixture
def state(tmp_path: Path) -> CountingState:
    return CountingState(tmp_path / "state")


@pytest.fixture
def sandbox(counted: CountingBackend) -> Iterator[Sandbox]:
    made = counted.create(unique_name("rp"))
    yield made
    made.destroy()


def three_commands_since(state: CountingState, sandbox: Sandbox) -> str:
    """A checkpoint, then three recorded commands; its id."""
    recorded = state.recorded(sandbox)
    target = recorded.checkpoint("before").id
    for i in range(3):
        recorded.exec(f"echo {i} > /root/f{i}")
    recorded.close()
    return target


def restored_as(state: CountingState, counted: CountingBackend, name: str, target: str) -> None:
    [restored] = state.journal(counted, name).records_of(RestoreRecord)
    assert (restored.id, restored.discarded) == (target, 3)


def test_one_cli_restore_with_yes_lists_once_reads_the_journal_once_and_takes_no_diff(
        counted: CountingBackend, state: CountingState, sandbox: Sandbox) -> None:
    target = three_commands_since(state, sandbox)
    workspace = Workspace(state=state)
    workspace.use(counted)
    counted.calls.clear()
    state.reads.clear()

    result = CliRunner().invoke(checkpoints.checkpoint, ["restore", sandbox.name, target, "--yes"], obj=workspace)

    assert result.exit_code == 0, result.output
    assert "echo 2 > /root/f2" in result.output  # the commands it throws away, from the journal
    assert f"file changes: unknown (not counted with --yes; hermes-sandboxes checkpoint diff {sandbox.name} " \
           f"{target} lists them)" in result.output
    assert counted.calls["checkpoints"] == 1
    assert counted.calls["diff"] == 0
    assert counted.calls["restore"] == 1
    assert sum(state.reads.values()) == 1, state.reads  # the sandbox's journal, once; the audit log never
    assert state.reads[f"{sandbox.name}.jsonl"] == 1
    restored_as(state, counted, sandbox.name, target)
    assert sandbox.exec("test -e /root/f0").exit_code == 1


def test_the_python_api_restore_takes_no_diff(counted: CountingBackend, state: CountingState,
                                              sandbox: Sandbox) -> None:
    target = three_commands_since(state, sandbox)
    recorded = state.recorded(sandbox)
    counted.calls.clear()
    try:
        discarded = recorded.restore(target)
    finally:
        recorded.close()
    assert [r.command for r in discarded or ()] == [f"echo {i} > /root/f{i}" for i in range(3)]
    assert (counted.calls["diff"], counted.calls["restore"], counted.calls["checkpoints"]) == (0, 1, 1)
    restored_as(state, counted, sandbox.name, target)


def test_mcp_restore_with_confirm_takes_no_diff_and_its_preview_one(
        counted: CountingBackend, state: CountingState, sandbox: Sandbox) -> None:
    target = three_commands_since(state, sandbox)
    settings = backends.validate("local", {}, where="this test")  # the counting backend is the local one
    host = Host(backend=lambda: counted, state=lambda: state, settings=lambda: settings,  # the journals above
                owners=lambda: Owners(state.backend_dir(counted.key) / "owners"))
    running = build(host, Rules(pinned=sandbox.name))
    seen: dict[str, int] = {}

    async def scenario(client: Client) -> None:
        counted.calls.clear()
        preview = await call_ok(client, "checkpoint_restore", checkpoint=target)
        assert preview["applied"] is False and preview["summary"] is not None, preview
        seen["preview"] = counted.calls["diff"]
        counted.calls.clear()
        done = await call_ok(client, "checkpoint_restore", checkpoint=target, confirm=True)
        assert done["applied"] is True and done["discarded_commands"][-1] == "echo 2 > /root/f2", done
        seen["confirmed"], seen["restored"] = counted.calls["diff"], counted.calls["restore"]

    try:
        drive(InProcess(running), scenario)
    finally:
        running.close()
    assert seen == {"preview": 1, "confirmed": 0, "restored": 1}
    restored_as(state, counted, sandbox.name, target)


def test_hermes_undo_with_yes_takes_no_diff_and_its_preview_one(
        counted: CountingBackend, state: CountingState, sandbox: Sandbox) -> None:
    target = three_commands_since(state, sandbox)
    recorded: RecordedSandbox = state.recorded(sandbox)
    chat = Target(LocalProvider(), recorded, None)
    try:
        counted.calls.clear()
        preview = slash.undo(chat, [target])
        assert f"/sandbox undo {target} --yes" in preview and "added" in preview, preview
        assert counted.calls["diff"] == 1
        counted.calls.clear()
        done = slash.undo(chat, [target, "--yes"])
        assert done.startswith(f"Undone: {sandbox.name} is back at {target}; 3 command(s)"), done
        assert (counted.calls["diff"], counted.calls["restore"]) == (0, 1)
    finally:
        recorded.close()
    note = take_note(recorded.journal.path)
    assert note is not None and note["changes"] == slash.NOT_COUNTED and len(note["discarded"]) == 3, note
    restored_as(state, counted, sandbox.name, target)
