"""cgroup v1: the sandbox joins a group of its own in every mounted hierarchy.

Limits use the memory, pids and cpu controllers; the freezer stops and kills. The other
hierarchies (devices, blkio, cpuset, net_cls, perf_event, hugetlb, name=systemd, the hybrid
cgroup2 mount, ...) carry no limit of ours, but the sandbox joins them too: a process left in the
host's root group of a hierarchy would reach that root through any cgroup mount it manages to make.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path

from hermes_sandboxes.backends.local.cgroups import groupfs
from hermes_sandboxes.backends.local.cgroups.base import BOX, CPU_PERIOD_US, SandboxCgroups, count_in
from hermes_sandboxes.sandbox import Limits


def _key_with(level: Mapping[str, Path], controller: str) -> Path | None:
    return next((d for k, d in level.items() if controller in k.split(",")), None)


class V1Cgroups(SandboxCgroups):
    version = 1

    def __init__(self, dirs: Mapping[str, str], box: str = BOX) -> None:
        super().__init__(dirs, box)
        self.freezer_key = next(k for k in self.dirs if "freezer" in k.split(","))

    def _prepare(self, key: str, group: Path, level: str) -> None:
        if "cpuset" in key.split(","):  # a new cpuset is empty, and nothing can join an empty one
            for name in ("cpuset.cpus", "cpuset.mems"):
                if not groupfs.read(group / name):
                    groupfs.write(group / name, groupfs.read(group.parent / name))

    def oom_kills(self) -> int | None:
        # v1 counts a kill in the group of its victim (the box, under the sandbox's group), not in
        # the group whose limit was hit: add up the sandbox's tree
        memory = _key_with({k: Path(d) for k, d in self.dirs.items()}, "memory")
        if memory is None:
            return None
        counts = [count_in(Path(d) / "memory.oom_control", "oom_kill") for d, _, _ in os.walk(memory)]
        return sum(c for c in counts if c is not None)

    def _write_limits(self, level: Mapping[str, Path], limits: Limits) -> None:
        memory, pids, cpu = (_key_with(level, c) for c in ("memory", "pids", "cpu"))
        if memory and limits.memory_bytes:
            groupfs.write(memory / "memory.limit_in_bytes", str(limits.memory_bytes))
            swap = memory / "memory.memsw.limit_in_bytes"
            if swap.exists():  # no swapping around the limit where swap accounting exists
                with contextlib.suppress(OSError):
                    groupfs.write(swap, str(limits.memory_bytes))
        if pids and limits.pids:
            groupfs.write(pids / "pids.max", str(limits.pids))
        if cpu and limits.cpus:
            groupfs.write(cpu / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            groupfs.write(cpu / "cpu.cfs_quota_us", str(int(limits.cpus * CPU_PERIOD_US)))
