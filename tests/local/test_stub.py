"""The init's pre-positioned stubs (backends/local/stub.py): children of the init waiting in spare
freezer groups, each becoming a command whose group is the spare one renamed. Whatever happens to
them, commands still run inside their own group, and the init never hangs or leaks a group."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermes_sandboxes.backends.local import LocalBackend, LocalSandbox, incarnation
from hermes_sandboxes.sandbox import Limits, SandboxSpec
from tests.local.kit import box_dir, cgroup_dir, cgroup_version, init_state, new_sandbox, pid_alive, sh, wait_for

POOL = 2  # stub.POOL_SIZE, restated: the test says what it expects


def _stubs(sb: LocalSandbox) -> list[int]:
    """Host pids of the init's children named hermes-stub."""
    init = int(init_state(sb)["pid"])
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            comm, rest = stat[stat.index("(") + 1: stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
            if comm == "hermes-stub" and int(rest[1]) == init and rest[0] != "Z":
                found.append(int(entry.name))
    return sorted(found)


def _ready(sb: LocalSandbox) -> list[int]:
    """The stubs once all POOL have moved into spare groups of the box (their own moves done)."""
    box = box_dir(sb, "freezer")
    spare = {int(p) for d in box.glob("spare*") for p in (d / "cgroup.procs").read_text().split()}
    stubs = _stubs(sb)
    return stubs if len(stubs) == POOL and set(stubs) <= spare else []


def _wait_ready(sb: LocalSandbox) -> list[int]:
    wait_for(lambda: bool(_ready(sb)), f"{POOL} stubs in spare groups")
    return _ready(sb)


def _no_empty_spare_group(sb: LocalSandbox) -> bool:
    return all((d / "cgroup.procs").read_text().split() for d in box_dir(sb, "freezer").glob("spare*"))


@pytest.fixture
def v1_sandbox(local_backend: LocalBackend) -> Iterator[LocalSandbox]:
    with new_sandbox(local_backend) as sb:
        sh(sb, "true")
        if cgroup_version(sb) != 1:  # tests/guest's cgroup v2: no rename of a group, hence no stubs
            pytest.skip("stubs need cgroup v1's rename of a group; this host's freezer is on v2")
        yield sb


def test_a_command_after_a_quiet_spell_is_a_stub_born_in_its_own_group(v1_sandbox: LocalSandbox) -> None:
    sb = v1_sandbox
    stubs = _wait_ready(sb)
    assert "hermes-stub" in sh(sb, "ps -eo comm").stdout  # what root inside sees, by name
    stubs = _wait_ready(sb)
    proc = sb.start("exec sleep 60", tag="stubtag1")
    group = box_dir(sb, "freezer") / "xstubtag1"
    wait_for(lambda: (group / "cgroup.procs").exists(), "the command's group")  # start() does not wait
    procs = [int(p) for p in (group / "cgroup.procs").read_text().split()]
    assert len(procs) == 1 and procs[0] in stubs  # the stub became the command, in the command's group
    wait_for(lambda: Path(f"/proc/{procs[0]}/comm").read_text().strip() == "sleep", "the exec of sleep")
    other = next(p for p in stubs if p != procs[0])
    assert sb.kill_tagged("stubtag1")
    assert proc.wait(timeout=30) != 0
    assert pid_alive(other)  # a command's group kill never reaches a waiting stub
    result = sb.exec("sleep 30", timeout=0.5)
    assert result.exit_code == 124
    assert pid_alive(other) or other not in _stubs(sb)  # used by that command, or untouched
    assert sh(sb, "echo $PWD; trap", cwd="/tmp").stdout == "/tmp\n"  # no signal left ignored
    assert sb.exec(["no-such-program"]).exit_code == 127


def test_stubs_killed_from_inside_leave_commands_running_and_come_back(v1_sandbox: LocalSandbox) -> None:
    sb = v1_sandbox
    stubs = _wait_ready(sb)
    # the stubs carry the init's command line: a pkill -f of it reaches them (the init ignores it)
    sh(sb, "pkill -f 'hermes-sandboxes-[i]nit'")
    wait_for(lambda: not set(stubs) & set(_stubs(sb)), "the stubs killed from inside to be reaped")
    assert sh(sb, "echo ok").stdout == "ok\n"
    wait_for(lambda: _no_empty_spare_group(sb), "the dead stubs' groups to be removed")
    _wait_ready(sb)
    sh(sb, "kill -9 -1; true")  # everything but PID 1 and itself
    assert sh(sb, "echo still").stdout == "still\n"
    _wait_ready(sb)
    # stopped by root inside: the command that gets it runs once it is continued, or another takes over
    stubs = _wait_ready(sb)
    sh(sb, "pkill -STOP -x hermes-stub")
    proc = sb.start("echo late")
    sh(sb, "pkill -CONT -x hermes-stub")
    assert proc.wait(timeout=30) == 0
    wait_for(lambda: _no_empty_spare_group(sb), "no empty spare group")


FILL = ("import os, time\n"
        "while True:\n"
        "    try:\n        pid = os.fork()\n    except OSError:\n        break\n"
        "    if pid == 0:\n        time.sleep(300)\n        os._exit(0)\n"
        "time.sleep(300)\n")


def test_at_the_pids_limit_a_waiting_stub_still_runs_a_command(local_backend: LocalBackend) -> None:
    with new_sandbox(local_backend, SandboxSpec(limits=Limits(pids=32))) as sb:
        sh(sb, "true")
        if cgroup_version(sb) != 1:
            pytest.skip("stubs need cgroup v1's rename of a group; this host's freezer is on v2")
        _wait_ready(sb)
        pids = cgroup_dir(sb, "pids")
        filler = sb.start(["python3", "-c", FILL], tag="filler")
        wait_for(lambda: (pids / "pids.current").read_text() == (pids / "pids.max").read_text(), "pids full")
        # The stub left needs no new pid: the sandbox at its limit still runs a command.
        assert sb.exec(["true"]).exit_code == 0
        assert sb.kill_tagged("filler")
        assert filler.wait(timeout=30) != 0
        assert sh(sb, "echo free").stdout == "free\n"
        _wait_ready(sb)  # and they are back once pids are free


def test_a_fork_bomb_s_timeout_leaves_the_stubs_and_the_init_serving(local_backend: LocalBackend) -> None:
    with new_sandbox(local_backend, SandboxSpec(limits=Limits(pids=64))) as sb:
        sh(sb, "true")
        if cgroup_version(sb) != 1:
            pytest.skip("stubs need cgroup v1's rename of a group; this host's freezer is on v2")
        _wait_ready(sb)
        assert sb.exec("b() { b | b & }; b; sleep 60", timeout=2).exit_code == 124
        assert sh(sb, "echo alive").stdout == "alive\n"
        _wait_ready(sb)


def test_checkpoint_and_restore_with_stubs_waiting(v1_sandbox: LocalSandbox) -> None:
    sb = v1_sandbox
    sh(sb, "echo one > /root/f")
    stubs = _wait_ready(sb)
    checkpoint = sb.checkpoint("with stubs")  # frozen and thawed with them inside
    assert set(stubs) <= set(_stubs(sb))
    sh(sb, "echo two > /root/f")
    old_box = box_dir(sb, "freezer")
    sb.restore(checkpoint.id)  # the old pid namespace's kill ends them with its init
    assert not any(pid_alive(p) for p in stubs)
    assert sh(sb, "cat /root/f").stdout == "one\n"
    incarnation.settle()  # the old box is cleared in the background: its spare groups go too
    assert not old_box.exists() or not [d for d in old_box.iterdir() if d.is_dir()]
    _wait_ready(sb)
