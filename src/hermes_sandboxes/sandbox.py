"""The backend-neutral contract: what every backend (local, Sprites, E2B) implements.

Callers depend on these types only. A backend states what it can do in ``Backend.capabilities``
so callers ask for a capability instead of testing backend names.
"""

from __future__ import annotations

import builtins
import enum
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from hermes_sandboxes.capture import BoundedCapture
from hermes_sandboxes.errors import Unsupported

NetworkMode = Literal["none", "loopback", "host", "proxy"]
NETWORK_MODES: tuple[NetworkMode, ...] = ("none", "loopback", "host", "proxy")

# A command is either an argv list (run as is) or a shell string (run by bash -c, or sh -c
# where the sandbox has no bash).
Command = str | Sequence[str]
OutputSink = Callable[[bytes], None]

TIMEOUT_EXIT_CODE = 124  # what `timeout(1)` and Hermes use for a command stopped by its deadline


class Capability(enum.StrEnum):
    CHECKPOINTS = "checkpoints"
    CHEAP_CHECKPOINTS = "cheap-checkpoints"  # constant-time, independent of the layer's size
    DIFF = "diff"
    BACKGROUND_PROCESSES = "background-processes"  # a daemon survives between execs
    NETWORK_POLICY = "network-policy"
    LIMITS = "limits"
    PERSISTENCE = "persistence"  # a named sandbox outlives the process that created it
    TREE_KILL = "tree-kill"  # a timeout kills every process the command started


class SandboxState(enum.StrEnum):
    RUNNING = "running"
    STOPPED = "stopped"  # exists, no processes (after a reboot or before first use)
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Limits:
    memory_bytes: int | None = None
    pids: int | None = None
    cpus: float | None = None
    disk_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"memory_bytes": self.memory_bytes, "pids": self.pids, "cpus": self.cpus,
                "disk_bytes": self.disk_bytes}


@dataclass(frozen=True)
class SandboxSpec:
    """How to build a sandbox. Backends ignore what they cannot honour and say so in info()."""

    network: NetworkMode = "none"
    limits: Limits = field(default_factory=Limits)
    base: str | None = None  # local backend: a rootfs directory; None means the host's root
    masks: tuple[str, ...] = ()  # extra paths to hide, on top of the backend's own list
    allow: tuple[str, ...] = ()  # egress allow-list, used with network="proxy"

    def to_dict(self) -> dict[str, Any]:
        return {
            "network": self.network,
            "limits": self.limits.to_dict(),
            "base": self.base,
            "masks": list(self.masks),
            "allow": list(self.allow),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SandboxSpec:
        limits = data.get("limits") or {}
        return cls(
            network=data.get("network", "none"),
            limits=Limits(
                memory_bytes=limits.get("memory_bytes"),
                pids=limits.get("pids"),
                cpus=limits.get("cpus"),
                disk_bytes=limits.get("disk_bytes"),
            ),
            base=data.get("base"),
            masks=tuple(data.get("masks") or ()),
            allow=tuple(data.get("allow") or ()),
        )


@dataclass(frozen=True)
class SandboxInfo:
    name: str
    backend: str
    ephemeral: bool
    state: SandboxState
    created_at: float
    spec: SandboxSpec
    layer_bytes: int | None = None  # size of what the sandbox changed, where known
    checkpoint_count: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "backend": self.backend,
            "ephemeral": self.ephemeral,
            "state": str(self.state),
            "created_at": self.created_at,
            "spec": self.spec.to_dict(),
            "layer_bytes": self.layer_bytes,
            "checkpoint_count": self.checkpoint_count,
        }


@dataclass(frozen=True)
class Checkpoint:
    id: str
    created_at: float
    comment: str = ""
    size_bytes: int | None = None  # writable-layer size captured, where known
    extra: Mapping[str, Any] = field(default_factory=dict)  # the story (journal), backend detail

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "created_at": self.created_at,
            "comment": self.comment,
            "size_bytes": self.size_bytes,
            **({"extra": dict(self.extra)} if self.extra else {}),
        }


class ChangeKind(enum.StrEnum):
    ADDED = "added"
    MODIFIED = "modified"
    DELETED = "deleted"


@dataclass(frozen=True)
class FileChange:
    path: str
    kind: ChangeKind
    size: int | None  # size now (None when deleted)
    old_size: int | None = None  # size before (None when added)


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    truncated: bool = False  # the capture dropped the middle of a long output

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass(frozen=True)
class DoctorCheck:
    ok: bool
    label: str
    detail: str


class Process(ABC):
    """A running command. Output goes to the sinks given to ``Sandbox.start`` as it arrives."""

    @property
    @abstractmethod
    def returncode(self) -> int | None:
        """The exit code once the command has finished, else None (128+N when killed by signal N)."""

    @abstractmethod
    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the exit code and for all output to reach the sinks; None if still running."""

    @abstractmethod
    def kill(self) -> None:
        """Kill the command and every process it started (setsid, nohup, double forks included)."""

    def poll(self) -> int | None:
        return self.wait(0)


class Sandbox(ABC):
    """One sandbox. Methods raise SandboxError subclasses with actionable messages."""

    name: str
    ephemeral: bool

    @property
    @abstractmethod
    def backend(self) -> Backend: ...

    @abstractmethod
    def info(self) -> SandboxInfo: ...

    @abstractmethod
    def start(
        self,
        command: Command,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        on_stdout: OutputSink | None = None,
        on_stderr: OutputSink | None = None,
    ) -> Process:
        """Start a command; it gets a fresh environment (never the host's) plus ``env``."""

    def exec(
        self,
        command: Command,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        timeout: float | None = None,
        on_stdout: OutputSink | None = None,
        on_stderr: OutputSink | None = None,
        capture_limit: int = 256 * 1024,
    ) -> ExecResult:
        """Run a command to completion (or its timeout), keeping the head and tail of its output."""
        out, err = BoundedCapture(capture_limit), BoundedCapture(capture_limit)
        lock = threading.Lock()

        def tee(capture: BoundedCapture, sink: OutputSink | None) -> OutputSink:
            def write(chunk: bytes) -> None:
                with lock:
                    capture.write(chunk)
                if sink is not None:
                    sink(chunk)

            return write

        started = time.monotonic()
        proc = self._start_for_exec(
            command, cwd=cwd, env=env, stdin=stdin,
            on_stdout=tee(out, on_stdout), on_stderr=tee(err, on_stderr),
        )
        try:
            code = proc.wait(timeout)
        except BaseException:  # Ctrl-C or a lost sandbox: never leave the command running inside
            proc.kill()
            raise
        timed_out = code is None
        if timed_out:
            proc.kill()
            proc.wait()
            code = TIMEOUT_EXIT_CODE
        assert code is not None
        return ExecResult(
            exit_code=code,
            stdout=out.text(),
            stderr=err.text(),
            duration_s=time.monotonic() - started,
            timed_out=timed_out,
            truncated=out.truncated or err.truncated,
        )

    def _start_for_exec(
        self,
        command: Command,
        *,
        cwd: str | None,
        env: Mapping[str, str] | None,
        stdin: bytes | None,
        on_stdout: OutputSink,
        on_stderr: OutputSink,
    ) -> Process:
        """``start`` as used by ``exec``, whose caller waits: a backend may skip background work."""
        return self.start(command, cwd=cwd, env=env, stdin=stdin, on_stdout=on_stdout, on_stderr=on_stderr)

    @abstractmethod
    def read_file(self, path: str) -> bytes: ...

    @abstractmethod
    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None: ...

    @abstractmethod
    def delete_file(self, path: str) -> None: ...

    @abstractmethod
    def checkpoint(self, comment: str = "") -> Checkpoint: ...

    @abstractmethod
    def checkpoints(self) -> list[Checkpoint]:
        """Valid checkpoints, oldest first. A partial checkpoint is never listed."""

    @abstractmethod
    def restore(self, checkpoint_id: str) -> None:
        """Return the filesystem to the checkpoint. Running processes are stopped; the sandbox
        is usable again when this returns. On failure the sandbox is left as it was."""

    @abstractmethod
    def delete_checkpoint(self, checkpoint_id: str) -> None: ...

    def diff(self, from_id: str, to_id: str | None = None) -> list[FileChange]:
        """Changes from checkpoint ``from_id`` to ``to_id`` (or to now)."""
        raise Unsupported(f"the {self.backend.name} backend cannot diff checkpoints")

    @abstractmethod
    def destroy(self) -> None:
        """Remove the sandbox, its processes and its checkpoints. Idempotent."""


class Backend(ABC):
    name: str
    capabilities: frozenset[Capability]

    @abstractmethod
    def open(self, name: str, spec: SandboxSpec | None = None) -> Sandbox:
        """Resume the persistent sandbox ``name`` or create it with ``spec``.

        Refuses to adopt an ephemeral sandbox. ``spec`` only applies at creation."""

    @abstractmethod
    def create(self, name: str, spec: SandboxSpec | None = None, *, ephemeral: bool = False) -> Sandbox:
        """Create a new sandbox; SandboxExists if the name is taken."""

    @abstractmethod
    def create_ephemeral(self, spec: SandboxSpec | None = None, prefix: str = "tmp") -> Sandbox:
        """A run-unique sandbox that is never adopted; destroy() it when done."""

    @abstractmethod
    def get(self, name: str) -> Sandbox:
        """An existing sandbox (persistent or ephemeral); SandboxNotFound otherwise."""

    @abstractmethod
    def list(self) -> builtins.list[SandboxInfo]: ...

    def doctor(self) -> builtins.list[DoctorCheck]:
        return []
