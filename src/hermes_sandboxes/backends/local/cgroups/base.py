"""The control groups of one sandbox: the interface both cgroup versions implement.

Layout, in every hierarchy the version uses::

    <base>/hermes-sandboxes-<store digest>/     shared by a store's sandboxes: the ceiling of all of them
    <base>/hermes-sandboxes-<store digest>/<name>/       the sandbox: its limits
    <base>/hermes-sandboxes-<store digest>/<name>/box/    an incarnation: its init, and below it
                                                          x<exec id> per command
    <base>/hermes-sandboxes-<store digest>/<name>/box2/   the next incarnation (they alternate)

The store digest keeps two stores' sandboxes of the same name apart. Processes live one level
below the group that carries the limits: the init starts a cgroup namespace rooted at its box, so
whatever root inside could ever write through a cgroup mount of its own stays under that box and
never reaches the limits (nor any group of the host). Each start of the init (an incarnation) uses
the box the one before did not: a restore's new launcher joins its box while the old incarnation,
in the other box under the same limits, is still being killed (a join waits for the kernel, ~5-10 ms
on v1). Two boxes that stay, rather than one made and removed per start: creating and removing
cgroups in every hierarchy cost tens of milliseconds on a busy host.
"""

from __future__ import annotations

import contextlib
import os
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from pathlib import Path

from hermes_sandboxes.backends.local.cgroups import groupfs
from hermes_sandboxes.names import digest
from hermes_sandboxes.sandbox import Limits
from hermes_sandboxes.util.values import replace

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the hot path of a CLI exec)
if TYPE_CHECKING:
    from typing import Any

PARENT_PREFIX = "hermes-sandboxes-"
BOX = "box"
CPU_PERIOD_US = 100_000


BOXES = (BOX, f"{BOX}2")


def next_box(current: str | None) -> str:
    """The box the incarnation after the one in ``current`` (None: no incarnation) uses."""
    return BOXES[1] if current == BOXES[0] else BOXES[0]


def store_dir_name(home: Path) -> str:
    """The shared parent group's name for the store at ``home``."""
    return PARENT_PREFIX + digest(str(home), 12)


def ceiling() -> Limits:
    """What all sandboxes of one store may use together: a backstop that keeps the host usable
    however many sandboxes run. Memory: all but an eighth of RAM (at least 512 MiB kept back);
    processes: half of what the kernel allows; CPU: all cores but half of one (at least one)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    memory = max(total - max(total // 8, 512 << 20), 256 << 20)
    kernel_max = min(_read_int("/proc/sys/kernel/pid_max", 32768), _read_int("/proc/sys/kernel/threads-max", 32768))
    cores = os.cpu_count() or 1
    return Limits(memory_bytes=memory, pids=max(kernel_max // 2, 1024), cpus=max(1.0, cores - 0.5))


def _read_int(path: str, default: int) -> int:
    try:
        with open(path) as f:
            return int(f.read())
    except (OSError, ValueError):
        return default


class SandboxCgroups(ABC):
    """One sandbox's groups: ``dirs`` maps each hierarchy used to the sandbox's own group in it;
    ``box`` names the box (below each of them) of one incarnation."""

    version: int = 0
    freezer_key: str = ""  # the hierarchy whose groups freeze and kill
    tracks_trees = True  # every process a command starts stays in its group (cgroups.none: no group)

    def __init__(self, dirs: Mapping[str, str], box: str = BOX) -> None:
        self.dirs = dict(dirs)
        self.box = box

    def to_state(self) -> dict[str, Any]:
        return {"version": self.version, "dirs": dict(self.dirs), "box": self.box}

    def with_box(self, box: str) -> SandboxCgroups:
        """The same sandbox's groups, for the incarnation whose box is ``box``."""
        return type(self)(self.dirs, box)

    @property
    def group(self) -> Path:
        """The sandbox's group in the hierarchy that freezes and kills."""
        return Path(self.dirs[self.freezer_key])

    @property
    def freezer(self) -> Path:
        """Where the init lives; each command gets a child group ``x<exec id>`` here."""
        return self.group / self.box

    @property
    def join_dirs(self) -> list[str]:
        """The groups the launcher moves itself into (so the init is born inside them)."""
        return [os.path.join(d, self.box) for d in self.dirs.values()]

    def delegate(self, uid: int, gid: int) -> None:
        """Hand the incarnation's box in the freezing hierarchy to the host ids of the sandbox's
        root (root mode runs the init in a user namespace of its own): it makes, moves into,
        renames and removes the commands' groups there, as systemd lets a delegated service do.
        The limits sit on the sandbox's group above, which stays root's; nothing inside the sandbox
        sees the host's cgroup tree (its cgroup namespace and mounts)."""
        box = self.freezer
        os.chown(box, uid, gid)
        for name in ("cgroup.procs", "tasks", "cgroup.threads"):
            with contextlib.suppress(FileNotFoundError):
                os.chown(box / name, uid, gid)

    def leftovers(self) -> list[Path]:
        """The commands' groups left in this box (of an incarnation killed while they ran), in every
        hierarchy: empty once it is stopped, to be removed."""
        found = []
        for directory in self.dirs.values():
            with contextlib.suppress(FileNotFoundError):
                found += [Path(e.path) for e in os.scandir(Path(directory) / self.box) if e.is_dir()]
        return found

    # set-up ---------------------------------------------------------------------------------------
    def create(self, limits: Limits) -> None:
        """Make the shared parents (with the ceiling), the sandbox's groups and boxes; apply limits."""
        for attempt in range(3):
            try:
                self._create_groups()
                break
            except FileNotFoundError:  # a parent removed by the last sandbox going away: again
                if attempt == 2:
                    raise
        self._write_limits({k: Path(d).parent for k, d in self.dirs.items()}, ceiling())
        self.apply(limits)

    def _create_groups(self) -> None:
        for key, directory in self.dirs.items():
            sandbox = Path(directory)
            for level, group in (("parent", sandbox.parent), ("sandbox", sandbox), ("box", sandbox / self.box)):
                with contextlib.suppress(FileExistsError):
                    group.mkdir()
                self._prepare(key, group, level)

    def apply(self, limits: Limits) -> None:
        top = ceiling()
        if limits.cpus and top.cpus:  # v1 refuses a child quota above its parent's: never ask for it
            limits = replace(limits, cpus=min(limits.cpus, top.cpus))
        self._write_limits({k: Path(d) for k, d in self.dirs.items()}, limits)

    @abstractmethod
    def _prepare(self, key: str, group: Path, level: str) -> None:
        """Make a group usable (controllers, cpusets); idempotent, runs at every create."""

    @abstractmethod
    def _write_limits(self, level: Mapping[str, Path], limits: Limits) -> None:
        """Write ``limits`` to the groups of ``level`` (hierarchy key -> group)."""

    # running ------------------------------------------------------------------------------------
    def exists(self) -> bool:
        return self.group.is_dir()

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """Freeze every process of the sandbox for the duration of the block."""
        groupfs.freeze(self.group)
        try:
            yield
        finally:
            groupfs.thaw(self.group)

    def oom_kills(self) -> int | None:
        """How many processes the sandbox's memory limit has killed (None: cannot tell here)."""
        return None

    def is_frozen(self) -> bool:
        return groupfs.is_frozen(self.group)

    def thaw(self) -> None:
        groupfs.thaw(self.group)

    def kill_all(self) -> None:
        """Kill every process of the sandbox (init included) and wait until the groups are empty."""
        groupfs.kill_group(self.group, reaped=False)  # the caller waits for the init (see sandbox._stop)

    def remove(self) -> None:
        """Kill what is left and remove every group (commands' first). Idempotent."""
        if self.group.is_dir():
            groupfs.kill_group(self.group, reaped=False)
        for directory in self.dirs.values():
            groupfs.remove_tree(Path(directory))
            # the shared parent too once it is empty, so no group of ours outlives its last sandbox
            # (a concurrent create re-makes it: see create)
            with contextlib.suppress(OSError):
                Path(directory).parent.rmdir()


def count_in(path: Path, key: str) -> int | None:
    """The number after ``key`` in a flat-keyed cgroup file (``oom_kill 3``); None if absent."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return None
