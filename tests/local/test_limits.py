"""Limits: memory, pids and CPU per sandbox (cgroup v1 here, v2 in the guest run of tests/guest).
A hog dies inside; the host stays fine."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import pytest

from hermes_sandboxes.backends.local import LocalBackend, LocalSandbox, cgroups, default_limits
from hermes_sandboxes.errors import InvalidInput
from hermes_sandboxes.sandbox import ExecResult, Limits, SandboxSpec
from tests.local.kit import (
    cgroup_dir,
    cgroup_dirs,
    cgroup_version,
    init_state,
    new_sandbox,
    pid_alive,
    sandbox_commands,
    sh,
    wait_for,
)
from tests.patience import until_started

# the kernel's file for each limit and counter, by cgroup version
MEMORY_LIMIT = {1: "memory.limit_in_bytes", 2: "memory.max"}
MEMORY_PEAK = {1: "memory.max_usage_in_bytes", 2: "memory.peak"}


def _counter(text: str, key: str) -> int:
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    raise AssertionError(f"no {key} counter in {text!r}")


def _subtree_sum(group: Path, name: str, key: str) -> int:
    """A counter summed over ``group`` and the groups below it (those still there)."""
    total = 0
    for root, _, _ in os.walk(group):
        with contextlib.suppress(FileNotFoundError):  # a command's group, removed as we walked
            total += _counter((Path(root) / name).read_text(), key)
    return total


def _oom_kills(sb: LocalSandbox) -> int:
    memory = cgroup_dir(sb, "memory")
    if cgroup_version(sb) == 2:  # memory.events counts the whole subtree
        return _counter((memory / "memory.events").read_text(), "oom_kill")
    return _subtree_sum(memory, "memory.oom_control", "oom_kill")  # v1 counts where the victim was


def cpu_quota(sb: LocalSandbox) -> tuple[int, int]:
    """(quota, period) in microseconds."""
    cpu = cgroup_dir(sb, "cpu")
    if cgroup_version(sb) == 2:
        quota, period = (cpu / "cpu.max").read_text().split()
        return int(quota), int(period)
    return int((cpu / "cpu.cfs_quota_us").read_text()), int((cpu / "cpu.cfs_period_us").read_text())


def test_a_memory_hog_is_killed_inside_and_the_sandbox_still_works(local_backend: LocalBackend) -> None:
    limit = 64 << 20
    with new_sandbox(local_backend, SandboxSpec(limits=Limits(memory_bytes=limit))) as sb:
        sh(sb, "true")
        memory, version = cgroup_dir(sb, "memory"), cgroup_version(sb)
        assert int((memory / MEMORY_LIMIT[version]).read_text()) == limit
        init_pid = init_state(sb)["pid"]
        kills = _oom_kills(sb)
        # bytes * n writes every byte: the pages are really used (a bytearray could stay untouched)
        hog = sb.exec("python3 -c \"x = b'h' * (256 << 20); print('survived', len(x))\"", timeout=120)
        assert hog.exit_code == 137, (hog.exit_code, hog.stdout, hog.stderr)  # SIGKILL by the OOM killer
        assert "survived" not in hog.stdout
        assert _oom_kills(sb) > kills
        assert int((memory / MEMORY_PEAK[version]).read_text()) <= limit
        assert sh(sb, "echo still here").stdout == "still here\n"
        assert pid_alive(init_pid) and init_state(sb)["pid"] == init_pid  # the init was spared


def test_a_fork_bomb_is_contained_and_the_sandbox_survives(local_backend: LocalBackend) -> None:
    with new_sandbox(local_backend, SandboxSpec(limits=Limits(pids=64))) as sb:
        sh(sb, "true")
        pids = cgroup_dir(sb, "pids")
        assert (pids / "pids.max").read_text().strip() == "64"
        init_pid = init_state(sb)["pid"]
        hits_before: list[int] = []

        def attempt(timeout: float) -> ExecResult:
            hits_before.append(_subtree_sum(pids, "pids.events", "max"))
            return sb.exec("bomb() { bomb | bomb & }; bomb; sleep 600", timeout=timeout)

        # the bomb must hit the limit before its timeout (counted where the failed fork was, or up
        # the tree: sum them); a loaded machine may need a longer timeout for that, never a pass
        bomb = until_started(attempt, lambda _: _subtree_sum(pids, "pids.events", "max") > hits_before[-1],
                             first=4)
        assert bomb.exit_code == 124 and bomb.timed_out
        # ...and nothing of it is left, once init has reaped the killed processes (the pids counter
        # drops at reaping, a moment after the kill returned; seen lagging under load in CI)
        wait_for(lambda: int((pids / "pids.current").read_text()) <= 3, "the bomb's processes to be reaped")
        assert sh(sb, "echo alive").stdout == "alive\n"
        assert init_state(sb)["pid"] == init_pid
        assert not any("bomb" in c for c in sandbox_commands(sb))
    assert subprocess.run(["true"]).returncode == 0  # the host can still fork


def test_the_cpu_limit_is_applied_and_throttles(local_backend: LocalBackend) -> None:
    with new_sandbox(local_backend, SandboxSpec(limits=Limits(cpus=0.5))) as sb:
        sh(sb, "true")
        assert cpu_quota(sb) == (50_000, 100_000)
        stat = cgroup_dir(sb, "cpu") / "cpu.stat"

        def throttled() -> bool:
            return _counter(stat.read_text(), "nr_throttled") > 0

        # two busy loops ask for up to two cores; polled rather than timed, as a busy host may give
        # the sandbox less than its quota for a while (then nothing throttles it)
        spin = sb.start("for i in 1 2; do (while :; do :; done) & done; wait")
        try:
            wait_for(throttled, "the sandbox to be throttled")
        finally:
            spin.kill()


def test_every_process_of_the_sandbox_is_in_its_groups(local_backend: LocalBackend) -> None:
    with new_sandbox(local_backend) as sb:
        sh(sb, "nohup sleep 7700 >/dev/null 2>&1 &")
        state = init_state(sb)
        for key, directory in cgroup_dirs(sb).items():
            procs = cgroups.procs(directory)
            assert state["pid"] in procs, (key, directory)
            assert len(procs) >= 2, key  # the daemon too
            assert not (directory / "cgroup.procs").read_text().split(), key  # all below the limits


def test_a_sandbox_without_limits_gets_the_defaults(sandbox: LocalSandbox) -> None:
    sh(sandbox, "true")
    defaults = default_limits()
    assert defaults.memory_bytes and defaults.pids and defaults.cpus
    page = os.sysconf("SC_PAGE_SIZE")  # the kernel rounds the limit down to whole pages
    memory = int((cgroup_dir(sandbox, "memory") / MEMORY_LIMIT[cgroup_version(sandbox)]).read_text())
    assert memory == defaults.memory_bytes // page * page
    assert int((cgroup_dir(sandbox, "pids") / "pids.max").read_text()) == defaults.pids
    assert cpu_quota(sandbox)[0] == int(min(defaults.cpus, cgroups.ceiling().cpus or defaults.cpus) * 100_000)


@pytest.mark.parametrize("limits", [Limits(memory_bytes=1 << 20), Limits(pids=0), Limits(cpus=-1.0)],
                         ids=["memory-1M", "pids-0", "cpus-negative"])
def test_unusable_limits_are_rejected_before_anything_is_created(local_backend: LocalBackend,
                                                                 limits: Limits) -> None:
    before = local_backend.names()
    with pytest.raises(InvalidInput):
        local_backend.create("hsl-bad-limits", SandboxSpec(limits=limits))
    assert local_backend.names() == before
