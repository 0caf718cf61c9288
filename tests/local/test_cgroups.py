"""Cgroups that contain: a sandbox's processes sit in groups of their own in every hierarchy, below
the groups that carry its limits, under a parent per store that carries a ceiling of its own."""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from pathlib import Path

from hermes_sandboxes.backends.local import LocalBackend, LocalSandbox, cgroups
from hermes_sandboxes.backends.local.cgroups import hierarchies
from hermes_sandboxes.backends.local.client import LocalProcess
from hermes_sandboxes.sandbox import Limits, SandboxSpec
from tests.local.kit import (
    box_dir,
    box_dirs,
    cgroup_dir,
    cgroup_dirs,
    cgroup_version,
    fresh_name,
    init_state,
    new_sandbox,
    pid_alive,
    sh,
    temp_backend,
)


def _groups_of(pid: int) -> dict[str, str]:
    """/proc/PID/cgroup as the host sees it: hierarchy key -> path."""
    groups = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        number, names, path = line.split(":", 2)
        groups["unified" if number == "0" and not names else names] = path
    return groups


def _mount_args(h: hierarchies.Hierarchy) -> list[str]:
    if h.version == 2:
        return ["-t", "cgroup2"]
    options = ",".join(n if not n.startswith("name=") else f"none,{n}" for n in sorted(h.names))
    return ["-t", "cgroup", "-o", options]


def test_the_init_and_its_commands_are_in_their_own_group_in_every_hierarchy(sandbox: LocalSandbox) -> None:
    proc = sandbox.start("sleep 7801")
    assert isinstance(proc, LocalProcess)
    try:
        sh(sandbox, "true")
        dirs = cgroup_dirs(sandbox)
        mounted = {h.key: h for h in hierarchies.discover()}
        assert set(dirs) == set(mounted)  # every hierarchy mounted on the host, cgroup2 included
        host = _groups_of(1)
        boxes = box_dirs(sandbox)
        commands = cgroups.procs(box_dir(sandbox, "freezer") / f"x{proc.exec_id}")
        assert len(commands) == 1
        for pid in (init_state(sandbox)["pid"], *commands):
            for key, path in _groups_of(pid).items():
                h = mounted[key]
                where = h.mount / path.lstrip("/")
                assert where.is_relative_to(boxes[key]), (key, where)
                assert path != host[key]
    finally:
        proc.kill()
    inside = sh(sandbox, "cat /proc/self/cgroup").stdout  # a view rooted at the sandbox's box
    assert "hermes-sandboxes" not in inside and sandbox.name not in inside, inside


def test_a_cgroup_mount_in_the_sandboxs_namespace_sees_only_its_box(sandbox: LocalSandbox) -> None:
    """Whatever a sandbox could mount (were it ever able to), each hierarchy's root is its box:
    checked from the host by mounting every hierarchy inside the sandbox's cgroup namespace."""
    sh(sandbox, "true")
    init = init_state(sandbox)["pid"]
    marker = f"hsl-probe-{sandbox.name}"
    boxes = box_dirs(sandbox)
    with tempfile.TemporaryDirectory(prefix="hsl-cgview-") as view:
        for h in hierarchies.discover():
            script = (f"mount {' '.join(_mount_args(h))} none {view} && "
                      f"mkdir {view}/{marker} && ls {view}; umount {view}")
            done = subprocess.run(["nsenter", f"--cgroup=/proc/{init}/ns/cgroup", "unshare", "-m",
                                   "--propagation", "private", "sh", "-c", script],
                                  capture_output=True, text=True, timeout=30, check=False)
            try:
                assert done.returncode == 0, (h.key, done.stderr)
                assert not any(n.startswith(cgroups.PARENT_PREFIX) for n in done.stdout.split()), h.key
                assert (boxes[h.key] / marker).is_dir(), h.key
                assert not (h.mount / marker).exists() and not (h.own_dir() / marker).exists(), h.key
            finally:
                with contextlib.suppress(FileNotFoundError):
                    (boxes[h.key] / marker).rmdir()


ATTACK = r"""
set -u
unshare -UrmC --fork sh -c '
  for spec in "$@"; do
    key=${spec%%|*}; args=${spec#*|}
    mkdir -p /root/cg && mount $args none /root/cg || { echo "mount $key refused"; continue; }
    mkdir /root/cg/hsl-escape && echo "made $key"
    [ -e /root/cg/pids.max ] && echo max > /root/cg/pids.max && echo "raised pids.max $key"
    umount /root/cg
  done' attack "$@" 2>&1 || echo "unshare refused"
"""


FORKS = """
import os, signal
children = []
try:
    for _ in range(100):
        pid = os.fork()
        if pid == 0:
            signal.pause()
            os._exit(0)
        children.append(pid)
except OSError:
    pass
print(len(children))
for pid in children:
    os.kill(pid, signal.SIGKILL)
"""


def test_root_inside_cannot_reach_host_groups_nor_lift_its_limits(local_backend: LocalBackend) -> None:
    """Issue 12, finding 1: a user+cgroup namespace and cgroup mounts from inside. Blocked either
    before the mount, or the mounts show only the sandbox's box, where nothing lifts its limits."""
    with new_sandbox(local_backend, SandboxSpec(limits=Limits(pids=64, memory_bytes=256 << 20))) as sb:
        sh(sb, "true")
        found = hierarchies.discover()
        specs = [f"{h.key}|{' '.join(_mount_args(h))}" for h in found]
        result = sb.exec(["sh", "-c", ATTACK, "attack", *specs], timeout=60)
        dirs = cgroup_dirs(sb)
        try:
            for h in found:
                assert not (h.mount / "hsl-escape").exists(), h.key  # the host's root groups
                assert not (h.own_dir() / "hsl-escape").exists(), h.key
                if f"made {h.key}" in result.stdout:  # below the box (in the command's own group)
                    assert list(box_dirs(sb)[h.key].rglob("hsl-escape")), h.key
            assert (cgroup_dir(sb, "pids") / "pids.max").read_text().strip() == "64"
            limit = "memory.max" if cgroup_version(sb) == 2 else "memory.limit_in_bytes"
            assert int((cgroup_dir(sb, "memory") / limit).read_text()) == 256 << 20
            forks = sb.exec(["python3", "-c", FORKS], timeout=60)
            assert int(forks.stdout) < 64, (forks.stdout, forks.stderr)  # the limit holds
        finally:
            for directory in dirs.values():
                _remove_made(directory)


def _remove_made(directory: Path) -> None:
    """Remove the attack's ``hsl-escape`` groups below ``directory``. The backend removes a finished
    command's group on its own thread, so a group may vanish during this walk (os.walk skips it)."""
    for parent, names, _ in os.walk(directory, topdown=False):
        for name in names:
            if name == "hsl-escape":
                with contextlib.suppress(FileNotFoundError):
                    os.rmdir(os.path.join(parent, name))


def test_restores_alternate_the_init_between_two_boxes_under_the_same_limits(local_backend: LocalBackend) -> None:
    """A restore's new launcher joins the box the old incarnation does not use (while that one is
    still being killed); the old box is left empty, the limits stay, and the next restore goes back."""
    with new_sandbox(local_backend, SandboxSpec(limits=Limits(pids=64))) as sb:
        sh(sb, "nohup sleep 7802 >/dev/null 2>&1 &")
        checkpoint = sb.checkpoint()
        first = box_dirs(sb)
        sb.restore(checkpoint.id)
        second = box_dirs(sb)
        mounted = {h.key: h for h in hierarchies.discover()}
        for key, path in _groups_of(init_state(sb)["pid"]).items():
            assert (mounted[key].mount / path.lstrip("/")) == second[key], key
        for key in first:
            assert second[key] != first[key] and second[key].parent == first[key].parent, key
            assert cgroups.procs(first[key]) == [], key  # nothing of the old incarnation is left
        assert (cgroup_dir(sb, "pids") / "pids.max").read_text().strip() == "64"
        forks = sb.exec(["python3", "-c", FORKS], timeout=60)
        assert int(forks.stdout) < 64, (forks.stdout, forks.stderr)  # the limit holds in the new box
        sb.restore(checkpoint.id)
        assert box_dirs(sb) == first
        assert sh(sb, "echo back").stdout == "back\n"


def test_the_shared_parent_carries_a_ceiling_for_all_sandboxes_together(sandbox: LocalSandbox) -> None:
    sh(sandbox, "true")
    top = cgroups.ceiling()
    assert top.memory_bytes and top.pids and top.cpus
    memory, pids, cpu = (cgroup_dir(sandbox, c).parent for c in ("memory", "pids", "cpu"))
    assert memory.name == pids.name == cpu.name == cgroups.store_dir_name(sandbox.backend.home)
    page = os.sysconf("SC_PAGE_SIZE")
    if cgroup_version(sandbox) == 2:
        assert int((memory / "memory.max").read_text()) == top.memory_bytes // page * page
        assert (cpu / "cpu.max").read_text().split() == [str(int(top.cpus * 100_000)), "100000"]
    else:
        assert int((memory / "memory.limit_in_bytes").read_text()) == top.memory_bytes // page * page
        assert int((cpu / "cpu.cfs_quota_us").read_text()) == int(top.cpus * 100_000)
    assert int((pids / "pids.max").read_text()) == top.pids


def test_destroying_a_sandbox_leaves_the_same_name_in_another_store_alone(local_backend: LocalBackend) -> None:
    name = fresh_name()
    with temp_backend() as other:
        first, second = local_backend.create(name), other.create(name)
        try:
            sh(first, "nohup sleep 7802 >/dev/null 2>&1 &")
            sh(second, "nohup sleep 7803 >/dev/null 2>&1 &")
            assert set(cgroup_dirs(first).values()).isdisjoint(cgroup_dirs(second).values())
            survivor = init_state(second)["pid"]
            first.destroy()
            assert pid_alive(survivor) and init_state(second)["pid"] == survivor
            assert "sleep 7803" in sh(second, "ps -eo args").stdout
            assert all(d.is_dir() for d in cgroup_dirs(second).values())
        finally:
            first.destroy()
            second.destroy()


def test_doctor_says_which_cgroup_version_is_in_use_and_that_nothing_is_missing(sandbox: LocalSandbox) -> None:
    sh(sandbox, "true")
    version = cgroup_version(sandbox)
    checks = {c.label: c for c in sandbox.backend.doctor()}
    in_use = checks[f"cgroup v{version} in use (freezing, killing a command's tree)"]
    assert in_use.ok, in_use.detail
    for controller in ("memory", "pids", "cpu"):
        assert checks[f"cgroup v{version} {controller} (limits)"].ok
    if version == 1:
        assert checks["every cgroup hierarchy joined (no host group reachable)"].detail == "yes"
