"""cgroup v2: the same interface on the unified hierarchy.

Limits are ``memory.max`` (with ``memory.swap.max`` 0), ``pids.max`` and ``cpu.max`` on the
sandbox's group; ``cgroup.freeze`` stops it and ``cgroup.kill`` kills a group's whole subtree.
A group can only hand controllers to its children while it holds no process itself, so the
shared parent sits at the top of the hierarchy (the root is exempt from that rule), the sandbox's
group holds no process either, and the init and the commands live in ``box`` below it, which
enables no controller and so may have both processes and child groups.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path

from hermes_sandboxes.backends.local.cgroups import groupfs
from hermes_sandboxes.backends.local.cgroups.base import CPU_PERIOD_US, SandboxCgroups, count_in
from hermes_sandboxes.backends.local.cgroups.hierarchies import UNIFIED
from hermes_sandboxes.sandbox import Limits

LIMIT_CONTROLLERS = ("memory", "pids", "cpu")


def enable_controllers(group: Path) -> None:
    """Hand the limit controllers ``group`` has on to its children (each alone: one that cannot
    be enabled must not keep the others off)."""
    available = set(groupfs.read(group / "cgroup.controllers").split())
    enabled = set(groupfs.read(group / "cgroup.subtree_control").split())
    for controller in LIMIT_CONTROLLERS:
        if controller in available and controller not in enabled:
            with contextlib.suppress(OSError):
                groupfs.write(group / "cgroup.subtree_control", f"+{controller}")


class V2Cgroups(SandboxCgroups):
    version = 2
    freezer_key = UNIFIED

    def _prepare(self, key: str, group: Path, level: str) -> None:
        if level == "parent":  # the shared parent hands the controllers on to the sandboxes
            enable_controllers(group.parent)
            enable_controllers(group)

    def oom_kills(self) -> int | None:
        return count_in(Path(self.dirs[UNIFIED]) / "memory.events", "oom_kill")

    def _write_limits(self, level: Mapping[str, Path], limits: Limits) -> None:
        group = level[UNIFIED]
        if limits.memory_bytes and (group / "memory.max").exists():
            groupfs.write(group / "memory.max", str(limits.memory_bytes))
            if (group / "memory.swap.max").exists():  # no swapping around the limit
                groupfs.write(group / "memory.swap.max", "0")
        if limits.pids and (group / "pids.max").exists():
            groupfs.write(group / "pids.max", str(limits.pids))
        if limits.cpus and (group / "cpu.max").exists():
            groupfs.write(group / "cpu.max", f"{int(limits.cpus * CPU_PERIOD_US)} {CPU_PERIOD_US}")
