"""Per-sandbox control groups (cgroup v1: memory, pids, cpu, freezer).

Each sandbox gets one group per controller, created under the cgroup the creating process sits in
(on this machine kind the memory controller only lets us create children under our own group).
The freezer group has one child per exec (``x<exec id>``) so a timeout can freeze, kill and thaw
exactly what that command started, detached children included, while the rest of the sandbox lives.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from hermes_sandboxes.errors import BackendUnavailable, SandboxError
from hermes_sandboxes.sandbox import Limits

CONTROLLERS = ("freezer", "memory", "pids", "cpu")
REQUIRED = ("freezer",)  # without it we cannot kill a process tree or snapshot consistently
GROUP_PARENT = "hermes-sandboxes"
CPU_PERIOD_US = 100_000


def _v1_mounts() -> dict[str, Path]:
    """Controller name -> mount point of its v1 hierarchy."""
    mounts: dict[str, Path] = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            fields = post.split()
            if len(fields) < 3 or fields[0] != "cgroup":
                continue
            options = set(fields[2].split(","))
            for controller in CONTROLLERS:
                if controller in options:
                    mounts.setdefault(controller, Path(pre.split()[4]))
    return mounts


def _own_paths() -> dict[str, str]:
    paths: dict[str, str] = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, names, path = line.rstrip("\n").split(":", 2)
            for name in names.split(","):
                paths[name] = path
    return paths


def probe() -> tuple[dict[str, Path], list[str]]:
    """Usable controller base directories, and what is missing (for doctor and errors)."""
    mounts, own = _v1_mounts(), _own_paths()
    bases: dict[str, Path] = {}
    missing: list[str] = []
    for controller in CONTROLLERS:
        if controller not in mounts:
            missing.append(f"cgroup v1 '{controller}' controller is not mounted")
            continue
        base = mounts[controller] / own.get(controller, "/").lstrip("/") / GROUP_PARENT
        # looked at, not created: probing (doctor, availability checks) must leave no group behind
        if not (base.is_dir() or os.access(base.parent, os.W_OK)):
            missing.append(f"cannot create groups under {base.parent}")
            continue
        bases[controller] = base
    return bases, missing


@dataclass(frozen=True)
class SandboxCgroups:
    """The cgroup directories of one sandbox, by controller."""

    dirs: Mapping[str, str]

    @classmethod
    def for_sandbox(cls, name: str) -> SandboxCgroups:
        bases, missing = probe()
        absent = [m for m in missing if any(f"'{c}'" in m for c in REQUIRED)]
        if any(c not in bases for c in REQUIRED):
            raise BackendUnavailable(
                "local sandbox needs the cgroup v1 freezer controller: " + "; ".join(absent or missing)
            )
        return cls({c: str(base / name) for c, base in bases.items()})

    @property
    def freezer(self) -> Path:
        return Path(self.dirs["freezer"])

    def create(self, limits: Limits) -> None:
        for path in self.dirs.values():
            os.makedirs(path, exist_ok=True)
        self.apply(limits)

    def apply(self, limits: Limits) -> None:
        if "memory" in self.dirs and limits.memory_bytes:
            mem = Path(self.dirs["memory"])
            _write(mem / "memory.limit_in_bytes", str(limits.memory_bytes))
            swap = mem / "memory.memsw.limit_in_bytes"
            if swap.exists():  # no swapping around the limit where swap accounting exists
                with contextlib.suppress(OSError):
                    _write(swap, str(limits.memory_bytes))
        if "pids" in self.dirs and limits.pids:
            _write(Path(self.dirs["pids"]) / "pids.max", str(limits.pids))
        if "cpu" in self.dirs and limits.cpus:
            cpu = Path(self.dirs["cpu"])
            _write(cpu / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            _write(cpu / "cpu.cfs_quota_us", str(int(limits.cpus * CPU_PERIOD_US)))

    def join(self, pid: int = 0) -> None:
        """Move ``pid`` (0: the calling process) into every group of the sandbox."""
        for path in self.dirs.values():
            _write(Path(path) / "cgroup.procs", str(pid))

    def exists(self) -> bool:
        return self.freezer.is_dir()

    # freezing -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """Freeze every process of the sandbox for the duration of the block."""
        freeze(self.freezer)
        try:
            yield
        finally:
            thaw(self.freezer)

    def memory_usage(self) -> int | None:
        if "memory" not in self.dirs:
            return None
        try:
            return int((Path(self.dirs["memory"]) / "memory.usage_in_bytes").read_text())
        except (OSError, ValueError):
            return None

    def oom_kills(self) -> int:
        try:
            text = (Path(self.dirs["memory"]) / "memory.oom_control").read_text()
        except (OSError, KeyError):
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def kill_all(self) -> None:
        """Kill every process of the sandbox (init included) and wait until the groups are empty."""
        kill_group(self.freezer)

    def remove(self) -> None:
        """Kill what is left and remove every group (exec children first). Idempotent."""
        if self.freezer.is_dir():
            kill_group(self.freezer)
        for path in self.dirs.values():
            _remove_tree(Path(path))
            # the shared parent too once it is empty, so no group of ours outlives its last sandbox
            # (a concurrent create re-makes it: SandboxCgroups.create uses makedirs)
            with contextlib.suppress(OSError):
                Path(path).parent.rmdir()


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


# A group removed while we look at it (the init removes an exec's group as soon as it is empty)
# answers ENOENT, or ENODEV for a file opened just before the removal: both mean "no processes".
_GONE = (errno.ENOENT, errno.ENODEV)


def _procs(group: Path) -> list[int]:
    pids: list[int] = []
    for root, _dirs, _files in os.walk(group):
        try:
            with open(os.path.join(root, "cgroup.procs")) as f:
                pids.extend(int(p) for p in f.read().split())
        except OSError as exc:
            if exc.errno not in _GONE:
                raise
    return pids


def freeze(group: Path, timeout: float = 5.0) -> None:
    _write(group / "freezer.state", "FROZEN")
    deadline = time.monotonic() + timeout
    while (group / "freezer.state").read_text().strip() != "FROZEN":
        if time.monotonic() > deadline:
            thaw(group)
            raise SandboxError(f"could not freeze {group} within {timeout:.0f}s; try again")
        time.sleep(0.0005)


def is_frozen(group: Path) -> bool:
    fd = os.open(f"{group}/freezer.state", os.O_RDONLY)
    try:
        return os.read(fd, 64).strip() != b"THAWED"
    finally:
        os.close(fd)


def thaw(group: Path) -> None:
    try:
        _write(group / "freezer.state", "THAWED")
    except OSError as exc:
        if exc.errno not in _GONE:
            raise


def kill_group(group: Path, timeout: float = 10.0) -> None:
    """Freeze ``group`` (so nothing can fork away), SIGKILL all its processes, thaw, wait empty."""
    if not group.is_dir():
        return
    deadline = time.monotonic() + timeout
    while True:
        try:
            freeze(group)
        except OSError as exc:
            if exc.errno in _GONE:
                return
            raise
        for pid in _procs(group):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        thaw(group)
        if not _procs(group):
            return
        if time.monotonic() > deadline:
            raise SandboxError(f"processes in {group} survived SIGKILL for {timeout:.0f}s")
        time.sleep(0.002)


def _remove_tree(group: Path) -> None:
    if not group.is_dir():
        return
    for child in sorted((p for p in group.iterdir() if p.is_dir()), reverse=True):
        _remove_tree(child)
    deadline = time.monotonic() + 5
    while True:
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:  # EBUSY until the last killed task is reaped
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
            time.sleep(0.005)
