"""Where the local backend keeps things on the host, and the small file helpers around them.

    <home>/store.img, <home>/mnt/          the btrfs store (see store/base.py)
    <home>/sandboxes/<name>/sandbox.json   a sandbox exists exactly when this file does
    <home>/run/<name>/                     runtime: init.json (pid, start time, boot id),
                                           init.log, root/ (mount point, empty on host)
    <home>/s/<digest>                      the init's control socket (a short path: see below)
    <home>/locks/<name>.lock               per-sandbox lock (flock: released if the holder dies)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from hermes_sandboxes.errors import InvalidInput, SandboxBusy
from hermes_sandboxes.names import digest

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the hot path of a CLI exec)
if TYPE_CHECKING:
    from typing import Any

DEFAULT_HOME = Path("/var/lib/hermes-sandboxes")
HOME_ENV = "HERMES_SANDBOXES_HOME"
_SOCKET_MAX = 107  # sun_path holds 108 bytes including the terminating NUL
_SOCKET_DIGEST = 16  # sockets are named by a digest of the sandbox name, not the name itself, so
# the 108-byte limit of a socket path leaves room for a long home however long the name


def default_home() -> Path:
    """Root: /var/lib/hermes-sandboxes. Anyone else (rootless): $XDG_DATA_HOME/hermes-sandboxes,
    else ~/.local/share/hermes-sandboxes."""
    if os.geteuid() == 0:
        return DEFAULT_HOME
    xdg = os.environ.get("XDG_DATA_HOME")
    return (Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "share") / "hermes-sandboxes"


def resolve_home(home: str | os.PathLike[str] | None) -> Path:
    path = Path(home or os.environ.get(HOME_ENV) or default_home()).absolute()
    text = str(path)
    if any(c in text for c in ",:\\ \n\t"):
        # the path goes into overlayfs mount options, where these characters are separators
        raise InvalidInput(f"sandbox home {text!r} must not contain commas, colons, backslashes or spaces")
    longest_socket = len(text) + len("/s/") + _SOCKET_DIGEST
    if longest_socket > _SOCKET_MAX:
        raise InvalidInput(
            f"sandbox home {text!r} is too long ({len(text)} characters): unix socket paths under it "
            f"would exceed {_SOCKET_MAX} bytes; choose a home of at most "
            f"{_SOCKET_MAX - longest_socket + len(text)} characters"
        )
    return path


class Layout:
    def __init__(self, home: Path) -> None:
        self.home = home

    def meta_dir(self, name: str) -> Path:
        return self.home / "sandboxes" / name

    def meta_file(self, name: str) -> Path:
        return self.meta_dir(name) / "sandbox.json"

    def run_dir(self, name: str) -> Path:
        return self.home / "run" / name

    def socket_file(self, name: str) -> Path:
        return self.home / "s" / digest(name, _SOCKET_DIGEST)

    def lock_file(self, name: str) -> Path:
        return self.home / "locks" / f"{name}.lock"


def _write_atomically(path: Path, data: bytes, durable: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json(path: Path, data: Any, *, durable: bool = True) -> None:
    """Atomically replace ``path``: readers see the old content or the new, never a mix."""
    _write_atomically(path, json.dumps(data, indent=1, sort_keys=True).encode(), durable)


def read_json(path: Path) -> Any:
    """The parsed file, or None if it is missing or unreadable."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def locked(path: Path, what: str, timeout: float = 60.0) -> Iterator[None]:
    """Hold an exclusive flock on ``path``; SandboxBusy if another process holds it too long."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise SandboxBusy(f"{what} is busy: another process has held its lock for "
                                      f"{timeout:.0f}s; try again later") from None
                time.sleep(0.01)
        yield
    finally:
        os.close(fd)


def is_locked(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


_BOOT_ID: str | None = None


def boot_id() -> str:
    global _BOOT_ID
    if _BOOT_ID is None:
        with open("/proc/sys/kernel/random/boot_id") as f:
            _BOOT_ID = f.read().strip()
    return _BOOT_ID


def process_start_time(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), to tell a reused pid apart;
    None if no such process runs. A zombie counts as gone: a killed init stays one until the host's
    pid 1 reaps it (which can take seconds), and its socket answers nobody meanwhile."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def base_problem(base: str) -> str | None:
    """Why ``base`` (an absolute path) cannot be a root filesystem to build on, or None."""
    path = Path(base)
    what = "a root filesystem directory (with bin/, usr/, etc/)"
    if not path.exists():
        return f"{base!r} does not exist; expected {what}"
    if not path.is_dir():
        return f"{base!r} is not a directory; expected {what}"
    if not (path / "bin").exists():
        return f"{base!r} has no bin/: it is not {what}"
    return None
