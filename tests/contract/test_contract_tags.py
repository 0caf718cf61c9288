"""The contract for tagged commands (``Capability.KILL_TAGGED``), run against every backend: a command
started with a tag is killed by that tag from another handle (as another process would, after the one
that started it died), and no other command is touched."""

from __future__ import annotations

import os

import pytest

from hermes_sandboxes.errors import InvalidInput, Unsupported
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
        pytest.skip(f"the {backend.name} backend declares no kill-tagged (the previous test checks it refuses)")
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
    if not {Capability.KILL_TAGGED, Capability.TREE_KILL} <= backend.capabilities:
        pytest.skip(f"the {backend.name} backend does not promise to kill a command's tree")
    tag = os.urandom(8).hex()
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
