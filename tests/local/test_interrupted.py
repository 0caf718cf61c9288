"""Operations killed midway (SIGKILL of the host process) leave the sandbox as it was, and usable.

The operation runs in a child Python paused at a named point (kit.killed_at), then killed with
SIGKILL, which no cleanup code can intercept.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from hermes_sandboxes.backends.local import LocalBackend, LocalSandbox, cgroups, launcher
from hermes_sandboxes.errors import SandboxError
from tests.local.kit import cgroup_dir, init_state, killed_at, manifest, pid_alive, sh, wait_for, without_inodes


def test_a_checkpoint_killed_midway_leaves_the_sandbox_usable_and_lists_nothing_partial(
        sb: LocalSandbox, store_backend: LocalBackend) -> None:
    sh(sb, "echo before > /root/state; nohup sleep 7501 >/dev/null 2>&1 &")
    earlier = sb.checkpoint("earlier")
    freezer = cgroup_dir(sb, "freezer")

    def frozen_while_paused() -> None:
        assert cgroups.is_frozen(freezer)  # the kill lands in the worst place: the sandbox is frozen

    killed_at("checkpoint-staged", sb, "sb.checkpoint('partial')", frozen_while_paused)
    assert [c.id for c in sb.checkpoints()] == [earlier.id]  # nothing partial is listed
    assert sh(sb, "cat /root/state; echo usable").stdout == "before\nusable\n"  # not left frozen
    assert not cgroups.is_frozen(freezer)
    assert "sleep 7501" in sh(sb, "ps -eo args").stdout  # its processes ran on
    staged = store_backend.store.checkpoints_dir(sb.name)
    assert any(p.name.startswith(".tmp-") for p in staged.iterdir())  # the kill left a staged copy...
    after = sb.checkpoint("after")
    assert [c.id for c in sb.checkpoints()] == [earlier.id, after.id]
    assert not any(p.name.startswith(".") for p in staged.iterdir())  # ...which the next one removed
    sh(sb, "echo changed > /root/state")
    sb.restore(after.id)
    assert sh(sb, "cat /root/state").stdout == "before\n"


FILES = ["/root/state", "/root/only-after", "/etc/issue", "/root"]


def test_a_restore_killed_midway_leaves_the_files_exactly_as_they_were(
        sb: LocalSandbox, store_backend: LocalBackend) -> None:
    sh(sb, "echo at-checkpoint > /root/state")
    ck = sb.checkpoint()
    sh(sb, "echo after-checkpoint > /root/state; echo new > /root/only-after; rm /etc/issue")
    before = manifest(sb, FILES)
    killed_at("restore-staged", sb, f"sb.restore({ck.id!r})")
    # untouched, and the sandbox runs again (a fresh overlay mount may renumber directories)
    assert without_inodes(manifest(sb, FILES)) == without_inodes(before)
    assert sh(sb, "cat /root/state").stdout == "after-checkpoint\n"
    assert [c.id for c in sb.checkpoints()] == [ck.id]
    assert not any(p.name.startswith(".") for p in store_backend.store.sandbox_dir(sb.name).iterdir())
    sb.restore(ck.id)  # and a restore works afterwards
    assert sh(sb, "cat /root/state; test -e /etc/issue && echo base-back").stdout == "at-checkpoint\nbase-back\n"


def test_a_launcher_whose_caller_goes_away_starts_nothing_and_the_fork_server_ends_with_its_process(
) -> None:
    """Every start forks a launcher from the host process's fork server. A launcher whose caller
    died before handing over the configuration must start nothing, and the server must exit once
    the process that started it is gone (the kernel closes that process's end of its socket)."""
    server = launcher.ForkServer()
    ours, theirs = socket.socketpair()
    with ours:
        server.request(theirs)
        theirs.close()
        ours.shutdown(socket.SHUT_WR)  # end of file before any configuration, as if its caller died
        ours.settimeout(30)
        answer = b"".join(iter(lambda: ours.recv(4096), b""))
    assert b"no configuration" in answer, answer  # it said why, and reported no init's pid
    assert server.process.poll() is None  # one launcher's failure does not end the server
    server.control.close()
    assert server.process.wait(30) == 0


def _ns_pids(pid: int) -> list[int]:
    """The pid of ``pid`` in each pid namespace it is in, the host's first ([] once it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return []
    line = next((line for line in status.splitlines() if line.startswith("NSpid:")), "NSpid:")
    return [int(n) for n in line.split()[1:]]


def test_an_init_whose_starter_was_killed_before_recording_it_is_killed_by_the_next_start(
        sb: LocalSandbox) -> None:
    """The init runs, but the process that started it died before writing its record: nothing
    knows that init, so the next command must not leave it running beside the one it starts."""
    sb.stop()
    groups = cgroups.for_sandbox(sb.backend.home, sb.name)
    found: list[int] = []

    def members() -> list[int]:
        return [p for box in cgroups.BOXES for p in cgroups.procs(groups.with_box(box).freezer)]

    def the_unrecorded_init() -> list[int]:  # PID 1 of its own namespace (a stub it forked is not)
        return [p for p in members() if _ns_pids(p)[1:] == [1]]

    def running_unrecorded() -> None:  # its launcher (in the host's pid namespace alone) leaves the box
        wait_for(lambda: len(the_unrecorded_init()) == 1 and all(len(_ns_pids(p)) > 1 for p in members()),
                 "the launcher to exit")
        found.extend(the_unrecorded_init())

    killed_at("start-unrecorded", sb, "sb.exec(['true'])", running_unrecorded)
    [orphan] = found
    assert pid_alive(orphan)
    assert sh(sb, "echo works").stdout == "works\n"
    assert not pid_alive(orphan)
    assert the_unrecorded_init() == [init_state(sb)["pid"]]  # only the init that is known runs


def test_an_init_that_fails_during_set_up_says_why_and_leaves_nothing_running(sb: LocalSandbox) -> None:
    """The init reports its own failure to the host process (the launcher has gone by then)."""
    sb.stop()
    log = sb.backend.layout.run_dir(sb.name) / "init.log"
    log.unlink(missing_ok=True)
    log.mkdir(parents=True)  # the init cannot open its log: its first step fails
    groups = cgroups.for_sandbox(sb.backend.home, sb.name)
    try:
        with pytest.raises(SandboxError, match="failed to start: IsADirectoryError"):
            sb.exec(["true"])
        wait_for(lambda: not any(cgroups.procs(groups.with_box(b).freezer) for b in cgroups.BOXES),
                 "the failed init to be gone")
    finally:
        log.rmdir()
    assert sh(sb, "echo works").stdout == "works\n"

