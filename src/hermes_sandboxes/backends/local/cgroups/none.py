"""A sandbox without cgroups: rootless on a host that delegates none to the user.

Nothing to create, join or remove. A command's tree is its session, which the init kills itself,
and a freeze (for a consistent checkpoint) is the init stopping every process but itself; both are
asked of the init over its control socket (guest/sessions.py). No limit can be enforced here:
the backend refuses limits asked for explicitly, and applies the process count as an rlimit.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator, Mapping
from pathlib import Path

from hermes_sandboxes.backends.local import paths
from hermes_sandboxes.backends.local.cgroups.base import BOX, SandboxCgroups
from hermes_sandboxes.backends.local.guest import protocol
from hermes_sandboxes.errors import SandboxError
from hermes_sandboxes.sandbox import Limits

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def ask_init(socket_path: str, message: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    """One request to the init; its reply (``error`` raised)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(socket_path)
            protocol.send(sock, message)
            reply, _ = protocol.recv(sock)
        except (OSError, EOFError, protocol.ProtocolError) as exc:
            raise SandboxError(f"the sandbox's init did not answer {message.get('op')!r}: {exc}") from None
    if "error" in reply:
        raise SandboxError(str(reply["error"]))
    return reply


class NoCgroups(SandboxCgroups):
    version = 0
    tracks_trees = False

    def __init__(self, dirs: Mapping[str, str], box: str = BOX) -> None:
        super().__init__(dirs, box)  # dirs: {"socket": the init's control socket}

    @classmethod
    def of(cls, home: Path, name: str) -> NoCgroups:
        layout = paths.Layout(home)
        return cls({"socket": str(layout.socket_file(name)), "frozen": str(layout.run_dir(name) / "frozen")})

    @property
    def socket(self) -> str:
        return self.dirs["socket"]

    @property
    def group(self) -> Path:
        raise SandboxError("this sandbox has no cgroup")

    @property
    def join_dirs(self) -> list[str]:
        return []

    def leftovers(self) -> list[Path]:
        return []

    def create(self, limits: Limits) -> None:
        pass

    def _prepare(self, key: str, group: Path, level: str) -> None:
        pass

    def _write_limits(self, level: Mapping[str, Path], limits: Limits) -> None:
        pass

    def exists(self) -> bool:
        return False

    @property
    def _marker(self) -> Path | None:
        """A file that says a freeze is under way: whoever finds it with nobody holding the
        sandbox's lock (the freezer died) thaws the sandbox, as a cgroup's frozen state says."""
        marker = self.dirs.get("frozen")
        return Path(marker) if marker else None

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        if self._marker is not None:
            self._marker.touch()
        ask_init(self.socket, {"op": "freeze"})
        try:
            yield
        finally:
            self.thaw()

    def is_frozen(self) -> bool:
        return self._marker is not None and self._marker.exists()

    def thaw(self) -> None:
        with contextlib.suppress(SandboxError):
            ask_init(self.socket, {"op": "thaw"})
        if self._marker is not None:
            self._marker.unlink(missing_ok=True)

    def kill_all(self) -> None:
        pass  # the caller kills the init, and its pid namespace goes with it

    def remove(self) -> None:
        pass
