"""The contract for tagged commands (``Capability.KILL_TAGGED``), run against every backend: a command
started with a tag is killed by that tag from another handle (as another process would, after the one
that started it died), and no other command is touched; and the recorder, over each backend, stops
what a recorder that died left running."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hermes_sandboxes.errors import InvalidInput, Unsupported
from hermes_sandboxes.recorder import liveness
from hermes_sandboxes.recorder.records import ExecRecord, ExecStartRecord
from hermes_sandboxes.recorder.state import HostState
from hermes_sandboxes.sandbox import Backend, Capability, Sandbox


def _sleeps(sandbox: Sandbox) -> set[str]:
    """The durations of the ``sleep`` processes running in the sandbox."""
    return set(sandbox.exec("pgrep -ax sleep | awk '{print $3}'").stdout.split())


def test_a_tagged_command_is_killed_by_its_tag_from_another_handle_and_no_other(
        backend: Backend, sandbox: Sandbox) -> None:
    if Capability.KILL_TAGGED not in backend.capabilities:
        with pytest.raises(Unsupported):
            sandbox.kill_tagged("abc")
        return
    mine, other = os.urandom(8).hex(), os.urandom(8).hex()
    target = sandbox.start(["sleep", "311"], tag=mine)
    bystander = sandbox.start("sleep 312", tag=other)
    untagged = sandbox.start(["sleep", "313"])
    try:
        assert sandbox.exec("for i in $(seq 100); do pgrep -x sleep | wc -l | grep -qx 3 && break; "
                            "sleep 0.1; done; pgrep -x sleep | wc -l").stdout == "3\n"
        elsewhere = backend.get(sandbox.name)  # another handle, as a later process has
        assert elsewhere.kill_tagged(mine) is True
        assert target.wait(60) is not None
        assert _sleeps(sandbox) == {"312", "313"}  # only that command
        assert bystander.poll() is None and untagged.poll() is None
        assert elsewhere.kill_tagged(mine) is False  # ended: nothing to kill, and nothing else is
        assert elsewhere.kill_tagged(os.urandom(8).hex()) is False  # never started
        assert _sleeps(sandbox) == {"312", "313"}
    finally:
        for proc in (target, bystander, untagged):
            proc.kill()
            proc.wait(60)


def test_a_tagged_exec_runs_as_given_and_a_bad_tag_is_refused(backend: Backend, sandbox: Sandbox) -> None:
    if Capability.KILL_TAGGED not in backend.capabilities:
        # never given a tag (the recorder checks the capability first): untagged commands run as
        # given, and asking to kill by any tag, well formed or not, is refused
        assert sandbox.exec("exit 7").exit_code == 7
        for tag in (os.urandom(8).hex(), "UPPER"):
            with pytest.raises((Unsupported, InvalidInput)):
                sandbox.kill_tagged(tag)
        return
    tag = os.urandom(8).hex()
    result = sandbox.exec(["sh", "-c", 'echo "$0|$1|$HOME"', "a b", "'c'"], tag=tag)
    assert result.stdout == f"a b|'c'|{sandbox.home}\n" and result.exit_code == 0
    assert sandbox.exec("exit 7", tag=os.urandom(8).hex()).exit_code == 7
    for bad in ("", "UPPER", "with space", "x" * 33, "dash-ed"):
        with pytest.raises(InvalidInput):
            sandbox.start("true", tag=bad)
        with pytest.raises(InvalidInput):
            sandbox.kill_tagged(bad)


def test_a_tree_kill_backend_kills_what_a_tagged_command_started(backend: Backend, sandbox: Sandbox) -> None:
    if Capability.KILL_TAGGED not in backend.capabilities:
        with pytest.raises(Unsupported):
            sandbox.kill_tagged(os.urandom(8).hex())
        return
    tag = os.urandom(8).hex()
    if Capability.TREE_KILL not in backend.capabilities:
        # no promise about what it started: the tagged command itself is what must end
        proc = sandbox.start("exec sleep 324", tag=tag)
        try:
            assert sandbox.exec("for i in $(seq 100); do pgrep -x sleep >/dev/null && break; sleep 0.1; done; "
                                "pgrep -x sleep | wc -l").stdout == "1\n"
            assert backend.get(sandbox.name).kill_tagged(tag) is True
            assert proc.wait(60) is not None
            assert "324" not in _sleeps(sandbox)
        finally:
            proc.kill()
            proc.wait(60)
        return
    proc = sandbox.start("setsid sleep 321 & nohup sleep 322 >/dev/null 2>&1 & exec sleep 323", tag=tag)
    try:
        assert sandbox.exec("for i in $(seq 100); do pgrep -x sleep | wc -l | grep -qx 3 && break; "
                            "sleep 0.1; done; pgrep -x sleep | wc -l").stdout == "3\n"
        assert backend.get(sandbox.name).kill_tagged(tag) is True
        assert proc.wait(60) is not None
        assert _sleeps(sandbox) == set()
    finally:
        proc.kill()
        proc.wait(60)


def _dead_process() -> liveness.ProcessIdentity:
    """The identity of a real process that has exited since: a recorder killed with -9."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    identity = liveness.ProcessIdentity(child.pid, liveness.start_time(child.pid), liveness.boot_id())
    child.communicate(b"")
    return identity


def test_settling_stops_the_command_a_dead_recorder_left_running_and_no_other(
        backend: Backend, sandbox: Sandbox, tmp_path: Path) -> None:
    """What a recorder killed mid-command leaves (its command running under its record's id as tag,
    the record written ahead with the dead process as owner) is stopped and ended by the next
    settle, on every backend that can kill by tag (elsewhere it is ended as lost and left alone);
    a live recorder's command runs on."""
    tagging = Capability.KILL_TAGGED in backend.capabilities
    recorded = HostState(tmp_path, durable=False).recorded(sandbox)
    orphan_id, live_id = os.urandom(8).hex(), os.urandom(8).hex()
    tags = {orphan_id: orphan_id, live_id: live_id} if tagging else {orphan_id: None, live_id: None}
    orphan = sandbox.start(["sleep", "341"], tag=orphan_id if tagging else None)
    live = sandbox.start(["sleep", "342"], tag=live_id if tagging else None)
    for record_id, owner in ((orphan_id, _dead_process()), (live_id, liveness.current())):
        recorded.journal.append(ExecStartRecord(sandbox=sandbox.name, id=record_id, command=f"sleep {record_id}",
                                                owner=owner, tag=tags[record_id]))
    try:
        assert sandbox.exec("for i in $(seq 100); do pgrep -x sleep | wc -l | grep -qx 2 && break; "
                            "sleep 0.1; done; pgrep -x sleep | wc -l").stdout == "2\n"
        [ended] = recorded.settle()
        assert isinstance(ended, ExecRecord) and ended.id == orphan_id, ended
        assert ended.lost and ended.exit_code is None, ended
        if tagging:
            assert ended.killed and orphan.wait(60) is not None and _sleeps(sandbox) == {"342"}, ended
        else:  # no way to name it to the backend: recorded honestly, left alone
            assert not ended.killed and "may have run on" in (ended.error or ""), ended
            assert _sleeps(sandbox) == {"341", "342"}
        assert live.poll() is None
        assert recorded.settle() == []  # once; and the live recorder's command is never settled
    finally:
        for proc in (orphan, live):
            proc.kill()
            proc.wait(60)
