"""The backend-neutral contract: what every backend (local, Sprites, E2B) implements.

Callers depend on these types only. A backend states what it can do in ``Backend.capabilities``
so callers ask for a capability instead of testing backend names.

Rules every backend keeps (the conformance suite in tests/contract/ checks them):

- **Commands.** A ``str`` is a shell command line, run by ``bash -c`` (``sh -c`` where the sandbox
  has no bash); a sequence is an argv, run as is, without a shell. A backend whose service takes
  only one form converts: an argv becomes ``shlex.join(argv)`` for a shell-only service, a string
  becomes ``["bash", "-c", command]`` for an argv-only one. Commands get a fresh environment
  (never the host's) with ``HOME`` set to ``Sandbox.home``, plus the ``env`` given.
- **Stdin.** ``stdin`` is None (the command reads end-of-file at once), ``bytes`` (written to the
  command, then end-of-file), or a readable binary file object (``Stdin``): read in chunks as the
  command consumes them and passed on until the object's end-of-file, which the command then sees.
  A stream is never read whole into memory (it may be endless, ``yes | ...``), is read on a thread
  of the backend's own so output keeps flowing, and is not closed by the backend; what the command
  leaves unread when it exits is dropped.
- **Exit codes.** The command's own code; ``TIMEOUT_EXIT_CODE`` (124) when ``exec`` stopped it at
  its deadline; 128+N when signal N killed it.
- **Kill.** ``Process.kill()`` kills the command. With ``Capability.TREE_KILL`` it also kills every
  process the command started, ``setsid``, ``nohup`` and double forks included; without it,
  processes the command detached may survive (callers say so where it matters). After a kill,
  ``exec`` waits at most ``KILL_GRACE_S`` for the command to be gone and then raises
  ``SandboxUnreachable``: a lost connection can never hang it.
- **Tags.** With ``Capability.KILL_TAGGED``, ``start``, ``exec`` and ``attach`` take a ``tag``
  naming the command (``check_tag``: 1 to 32 characters of a-z and 0-9; the caller gives each
  command its own, a random id). ``kill_tagged(tag)``, from any process and also after the one that
  started the command died, kills that command (with ``Capability.TREE_KILL``, everything it
  started too) if it still runs, and never another command, whatever pids the sandbox reuses; it
  says whether there was anything to kill. A backend without the capability is never given a tag.
- **Files.** Paths are absolute (``InvalidInput`` otherwise); ``write_file`` creates missing parent
  directories and replaces the file; ``read_file`` / ``delete_file`` of a missing path raise
  ``SandboxFileNotFound``.
- **Specs.** A value of ``SandboxSpec`` a backend cannot honour is refused (``Unsupported`` or
  ``InvalidInput``) before anything is created, never silently ignored.
"""

from __future__ import annotations

import builtins
import enum
import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence

from hermes_sandboxes.errors import InvalidInput, SandboxUnreachable, SpecMismatch, Unsupported
from hermes_sandboxes.util.capture import BoundedCapture
from hermes_sandboxes.util.values import dataclass, field

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the hot path of a CLI exec)
if TYPE_CHECKING:
    from typing import Any, BinaryIO, Literal

    # none: no network at all; loopback: a private 127.0.0.1 only; host: whatever the backend's host
    # reaches (the internet, for a cloud sandbox); proxy: only what ``SandboxSpec.allow`` names.
    NetworkMode = Literal["none", "loopback", "host", "proxy"]
    # What a command reads: nothing, these bytes, or a binary stream read until its end (see Stdin rule).
    Stdin = bytes | BinaryIO | None

NETWORK_MODES: tuple[NetworkMode, ...] = ("none", "loopback", "host", "proxy")

# A command is either an argv list (run as is) or a shell string (run by bash -c, or sh -c
# where the sandbox has no bash).
Command = str | Sequence[str]
OutputSink = Callable[[bytes], None]

TAG_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")
MAX_TAG_CHARS = 32
TIMEOUT_EXIT_CODE = 124  # what `timeout(1)` and Hermes use for a command stopped by its deadline
KILL_GRACE_S = 30.0  # how long exec waits for a killed command before calling the sandbox unreachable


def __getattr__(name: str) -> object:
    """The type aliases ``NetworkMode`` and ``Stdin``, made when first asked for (by pydantic, or a
    user's annotations): they need ``typing``, which the hot path of a CLI exec does not import."""
    if name == "NetworkMode":
        from typing import Literal

        return Literal[NETWORK_MODES]
    if name == "Stdin":
        from typing import BinaryIO

        return bytes | BinaryIO | None
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Capability(enum.StrEnum):
    """What a backend can do beyond the contract's core; each flag is read by the faces, which
    degrade and say so where one is missing. Every backend runs commands, keeps files and named
    sandboxes across processes, and keeps background processes between commands."""

    CHECKPOINTS = "checkpoints"
    CHEAP_CHECKPOINTS = "cheap-checkpoints"  # constant-time, independent of the layer's size
    DIFF = "diff"
    LIMITS = "limits"  # SandboxSpec.limits are enforced
    TREE_KILL = "tree-kill"  # a timeout kills every process the command started
    DELETE_CHECKPOINTS = "delete-checkpoints"  # retention can prune old checkpoints
    FORK = "fork"  # Sandbox.fork: a new sandbox from a checkpoint of another
    TERMINAL = "terminal"  # Sandbox.attach: a command on the caller's own descriptors (a pty)
    EGRESS_ALLOWLIST = "egress-allowlist"  # network "proxy" with SandboxSpec.allow; Sandbox.set_allow
    KILL_TAGGED = "kill-tagged"  # start/exec/attach take a tag; Sandbox.kill_tagged stops that command later


class SandboxState(enum.StrEnum):
    RUNNING = "running"
    STOPPED = "stopped"  # exists, no processes (after a reboot or before first use)
    PAUSED = "paused"  # suspended by the service (memory kept or not); resumes on the next command
    UNKNOWN = "unknown"
    BROKEN = "broken"  # a create or destroy that never finished left something behind: only rm works


@dataclass(frozen=True)
class Limits:
    memory_bytes: int | None = None
    pids: int | None = None
    cpus: float | None = None
    disk_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"memory_bytes": self.memory_bytes, "pids": self.pids, "cpus": self.cpus,
                "disk_bytes": self.disk_bytes}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Limits:
        return cls(memory_bytes=data.get("memory_bytes"), pids=data.get("pids"), cpus=data.get("cpus"),
                   disk_bytes=data.get("disk_bytes"))

    def is_empty(self) -> bool:
        return all(v is None for v in (self.memory_bytes, self.pids, self.cpus, self.disk_bytes))


@dataclass(frozen=True)
class SandboxSpec:
    """How to build a sandbox, in terms every backend can mean. A backend refuses (never ignores)
    a value it cannot honour; backend-specific choices (the local backend's base filesystem and
    masks, a cloud account) are that backend's settings, not the spec's."""

    network: NetworkMode = "none"
    allow: tuple[str, ...] = ()  # egress allow-list for network "proxy": hosts, *.wildcards, IPs, :ports
    limits: Limits = field(default_factory=Limits)
    image: str | None = None  # an image or template name, for backends that build from one
    labels: Mapping[str, str] = field(default_factory=dict)
    # seconds without a command before the sandbox is stopped (local: its processes ended, files and
    # checkpoints kept; E2B: its lease; Sprites: refused, the service sleeps idle Sprites by itself)
    idle_timeout: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "network": self.network,
            "allow": list(self.allow),
            "limits": self.limits.to_dict(),
            "image": self.image,
            "labels": dict(self.labels),
            "idle_timeout": self.idle_timeout,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SandboxSpec:
        return cls(
            network=data.get("network", "none"),
            allow=tuple(data.get("allow") or ()),
            limits=Limits.from_dict(data.get("limits") or {}),
            image=data.get("image"),
            labels=dict(data.get("labels") or {}),
            idle_timeout=data.get("idle_timeout"),
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
class SandboxUsage:
    """One sandbox's disk use on this machine (``Backend.disk_usage``): its writable layer, its
    checkpoints counted each on its own, and what removing it would give back."""

    name: str
    layer_bytes: int
    checkpoint_bytes: int
    exclusive_bytes: int
    checkpoint_count: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "layer_bytes": self.layer_bytes, "checkpoint_bytes": self.checkpoint_bytes,
                "exclusive_bytes": self.exclusive_bytes, "checkpoint_count": self.checkpoint_count}


@dataclass(frozen=True)
class StoreUsage:
    """The store's disk use: ``used_bytes`` in its filesystem, ``host_bytes`` its image's allocation
    on the host disk (None where the store is a plain directory), and each sandbox's."""

    path: str
    used_bytes: int
    host_bytes: int | None
    sandboxes: tuple[SandboxUsage, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "used_bytes": self.used_bytes, "host_bytes": self.host_bytes,
                "sandboxes": [s.to_dict() for s in self.sandboxes]}


@dataclass(frozen=True)
class IdleStop:
    """The sandbox stopped itself at ``at`` (epoch seconds) after ``idle_timeout`` seconds idle."""

    at: float
    idle_timeout: float | None = None


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint as the backend knows it. Its story (why, what ran) is the recorder's
    ``StoriedCheckpoint``."""

    id: str
    created_at: float
    comment: str = ""
    size_bytes: int | None = None  # writable-layer size captured, where known

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "created_at": self.created_at, "comment": self.comment,
                "size_bytes": self.size_bytes}


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
        """Kill the command; with ``Capability.TREE_KILL`` every process it started too (setsid,
        nohup, double forks included). Callable from an output sink and from any thread."""

    def poll(self) -> int | None:
        """The exit code if the command has ended, else None, without waiting."""
        return self.wait(0)


class Sandbox(ABC):
    """One sandbox. Methods raise SandboxError subclasses with actionable messages."""

    name: str
    ephemeral: bool
    created: bool = False  # True when the open()/create() that returned this handle made the sandbox
    home: str = "/root"  # the home directory (HOME) commands get

    @property
    @abstractmethod
    def backend(self) -> Backend:
        """The backend this sandbox lives on (its name, capabilities and key)."""

    @abstractmethod
    def info(self) -> SandboxInfo:
        """The sandbox's state, spec and sizes now; SandboxNotFound once it was destroyed."""

    @abstractmethod
    def stop(self) -> None:
        """Stop every process of the sandbox (pause it, where the service pauses); its files stay
        and the next command starts it again."""

    def reserve(self, seconds: float) -> None:  # noqa: B027 - optional: only leased sandboxes override it
        """The caller's next ``start`` on this thread is a command it lets run up to ``seconds``
        (``exec`` knows its own timeout): a sandbox the service ends on its own (a cloud lease)
        makes sure, before this returns, that it outlives them. Elsewhere nothing to do."""

    @abstractmethod
    def start(
        self,
        command: Command,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: Stdin = None,
        on_stdout: OutputSink | None = None,
        on_stderr: OutputSink | None = None,
        tag: str | None = None,
    ) -> Process:
        """Start a command; it gets a fresh environment (never the host's) plus ``env``. ``tag``
        names it for ``kill_tagged`` (``Capability.KILL_TAGGED`` only; see the Tags rule)."""

    def exec(
        self,
        command: Command,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: Stdin = None,
        timeout: float | None = None,
        on_stdout: OutputSink | None = None,
        on_stderr: OutputSink | None = None,
        capture_limit: int = 256 * 1024,
        tag: str | None = None,
    ) -> ExecResult:
        """Run a command to completion (or its timeout), keeping the head and tail of its output;
        ``tag`` as for ``start``."""
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
            **({} if tag is None else {"tag": tag}),  # an override written before tags takes none
        )
        try:
            code = proc.wait(timeout)
        except BaseException:  # Ctrl-C or a lost sandbox: never leave the command running inside
            proc.kill()
            raise
        timed_out = code is None
        if timed_out:
            kill_and_reap(proc, self.name)
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
        stdin: Stdin,
        on_stdout: OutputSink,
        on_stderr: OutputSink,
        tag: str | None = None,
    ) -> Process:
        """``start`` as used by ``exec``, whose caller waits: a backend may skip background work."""
        tagged = {} if tag is None else {"tag": tag}  # a backend without KILL_TAGGED takes no tag
        return self.start(command, cwd=cwd, env=env, stdin=stdin, on_stdout=on_stdout, on_stderr=on_stderr,
                          **tagged)

    @abstractmethod
    def read_file(self, path: str) -> bytes:
        """The bytes of the file at absolute ``path`` inside the sandbox; SandboxFileNotFound when
        there is none, InvalidInput for a relative path."""

    @abstractmethod
    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Write ``data`` to absolute ``path`` inside the sandbox (its parent directories created,
        ``mode`` for a new file), replacing what was there; InvalidInput for a relative path."""

    @abstractmethod
    def delete_file(self, path: str) -> None:
        """Remove the file at absolute ``path`` inside the sandbox; SandboxFileNotFound when there
        is none."""

    @abstractmethod
    def checkpoint(self, comment: str = "") -> Checkpoint:
        """Save the sandbox's files as a new checkpoint (listed only once complete); Unsupported
        without ``Capability.CHECKPOINTS``, the backend's SandboxError when it could not be taken
        (then no checkpoint exists)."""

    @abstractmethod
    def checkpoints(self) -> list[Checkpoint]:
        """Valid checkpoints, oldest first. A partial checkpoint is never listed."""

    def all_checkpoints(self) -> list[Checkpoint]:
        """``checkpoints()`` and those a service makes by itself and hides by default (Sprites'
        automatic ones), oldest first: what ``checkpoint list --all`` shows."""
        return self.checkpoints()

    @abstractmethod
    def restore(self, checkpoint_id: str) -> None:
        """Return the filesystem to the checkpoint. Running processes are stopped; the sandbox
        is usable again when this returns. On failure the sandbox is left as it was."""

    @abstractmethod
    def delete_checkpoint(self, checkpoint_id: str) -> None:
        """Delete a checkpoint (its files can no longer be restored); CheckpointNotFound for an
        unknown id, Unsupported without ``Capability.DELETE_CHECKPOINTS``."""

    def diff(self, from_id: str, to_id: str | None = None) -> list[FileChange]:
        """Changes from checkpoint ``from_id`` to ``to_id`` (or to now); ``Capability.DIFF``."""
        raise Unsupported(f"the {self.backend.name} backend cannot diff checkpoints")

    def changed_since(self, checkpoint_id: str) -> bool | None:
        """Whether anything changed since the checkpoint, when the backend can tell cheaply
        (constant time); None when it cannot."""
        return None

    def take_idle_stops(self) -> builtins.list[IdleStop]:
        """When the sandbox stopped itself for being idle (``SandboxSpec.idle_timeout``) since the
        last call on this host, oldest first; each is reported once, for the caller to journal. The
        default: nothing (a backend whose service pauses on its own does not report it)."""
        return []

    def oom_kills(self) -> int | None:
        """How many processes the sandbox's memory limit has killed so far, so that a caller can say
        why a command died of SIGKILL; None when the backend cannot tell."""
        return None

    def fork(self, new_name: str, checkpoint_id: str | None = None) -> Sandbox:
        """A new persistent sandbox ``new_name`` whose files are those of ``checkpoint_id`` (or of
        this sandbox now); this sandbox is untouched. ``Capability.FORK``."""
        raise Unsupported(f"the {self.backend.name} backend cannot fork sandboxes")

    def attach(self, command: Command, fds: tuple[int, int, int], *, cwd: str | None = None,
               env: Mapping[str, str] | None = None, tag: str | None = None) -> Process:
        """Run ``command`` on the caller's own stdin, stdout and stderr descriptors (the slave end
        of a pseudo-terminal, for an interactive shell); ``tag`` as for ``start``.
        ``Capability.TERMINAL``."""
        raise Unsupported(f"the {self.backend.name} backend has no interactive terminal")

    def kill_tagged(self, tag: str) -> bool:
        """Kill the command started with ``tag`` (with ``Capability.TREE_KILL``, all it started too)
        if it still runs, from any process; True when there was something to kill, False when it had
        ended (or never started). Never touches another command. ``Capability.KILL_TAGGED``."""
        raise Unsupported(f"the {self.backend.name} backend cannot stop a command by its tag")

    def set_allow(self, allow: Sequence[str]) -> None:
        """Replace the egress allow-list of this sandbox (network "proxy"), running or not: it applies
        to the connections opened from now on (open ones keep going), without a restart, and is kept
        in ``info().spec.allow``. Entries as in ``SandboxSpec.allow``; a bad entry, or a sandbox whose
        network is not "proxy", is ``InvalidInput``. ``Capability.EGRESS_ALLOWLIST``."""
        raise Unsupported(f"the {self.backend.name} backend cannot change the egress allow-list of a sandbox")

    def open_terminal(self) -> tuple[int, int]:
        """A pseudo-terminal for ``attach()``: (master, slave) descriptors, both the caller's to close.
        This default is a pty of the caller's machine, which works but which ``tty`` inside cannot
        name; a backend that can allocates it where the sandbox sees it. ``Capability.TERMINAL``."""
        return os.openpty()

    @abstractmethod
    def destroy(self) -> None:
        """Remove the sandbox, its processes and its checkpoints. Idempotent."""


def spec_differences(have: SandboxSpec, want: SandboxSpec) -> list[str]:
    """How ``want`` differs from the spec a sandbox was made with (``have``), one phrase per field:
    what ``Backend.open`` refuses rather than silently hand back a sandbox built otherwise."""
    out = []
    for label, mine, asked in (("network", have.network, want.network), ("allow", have.allow, want.allow),
                               ("memory_bytes", have.limits.memory_bytes, want.limits.memory_bytes),
                               ("pids", have.limits.pids, want.limits.pids),
                               ("cpus", have.limits.cpus, want.limits.cpus),
                               ("disk_bytes", have.limits.disk_bytes, want.limits.disk_bytes),
                               ("image", have.image, want.image), ("labels", dict(have.labels), dict(want.labels)),
                               ("idle_timeout", have.idle_timeout, want.idle_timeout)):
        if mine != asked:
            out.append(difference(label, mine, asked))
    return out


def difference(label: str, have: object, want: object) -> str:
    """One field of a spec that differs, as ``SpecMismatch`` names it: ``network loopback, not host``."""
    return f"{label} {_shown(have)}, not {_shown(want)}"


def refuse_differences(name: str, differences: Sequence[str]) -> None:
    """SpecMismatch naming each of ``differences`` (phrases of ``difference``), when there are any."""
    if differences:
        raise SpecMismatch(f"sandbox {name} exists with {'; '.join(differences)}: open it without a spec to use "
                            "it as it is, or destroy it first (or pick another name) to get the spec asked for")


def refuse_other_spec(name: str, have: SandboxSpec, want: SandboxSpec | None) -> None:
    """SpecMismatch when ``open(name, want)`` found ``name`` made with another spec."""
    refuse_differences(name, [] if want is None else spec_differences(have, want))


def _shown(value: object) -> str:
    if isinstance(value, tuple | list):
        return "[" + ", ".join(map(str, value)) + "]"
    return "unset" if value is None else str(value)


def check_tag(tag: str) -> str:
    """``tag`` if it is a valid command tag (see the Tags rule), else InvalidInput."""
    if not 0 < len(tag) <= MAX_TAG_CHARS or not set(tag) <= TAG_CHARS:
        raise InvalidInput(f"a command tag is 1 to {MAX_TAG_CHARS} characters of a-z and 0-9, got {tag!r}")
    return tag


def kill_and_reap(proc: Process, sandbox: str) -> None:
    """Kill ``proc`` and wait a bounded time for it to be gone; SandboxUnreachable if it is not,
    so a connection lost mid-kill cannot hang the caller."""
    proc.kill()
    if proc.wait(KILL_GRACE_S) is None:
        raise SandboxUnreachable(
            f"sandbox {sandbox}: a killed command was still not reported gone after {KILL_GRACE_S:.0f}s; "
            "the connection to the sandbox may be lost, try again")


class Backend(ABC):
    """Where sandboxes live. ``key`` names that place stably (the host's journals are kept under
    it); ``close()`` releases what the backend holds (connections)."""

    name: str
    capabilities: frozenset[Capability]

    @property
    def key(self) -> str:
        """A stable id of where this backend's sandboxes live, e.g. ``local-<digest of its home>``."""
        return self.name

    def unavailable_reason(self) -> str | None:
        """Why this backend cannot run here (missing root, dependency or credentials), cheaply and
        without the network; None when it can."""
        return None

    def close(self) -> None:  # noqa: B027 - optional: only backends that hold connections override it
        """Release connections and other resources; the backend is not used afterwards."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def check_spec(self, spec: SandboxSpec) -> None:
        """Refuse what this backend's capabilities cannot honour; backends add their own checks."""
        if spec.network == "proxy" and Capability.EGRESS_ALLOWLIST not in self.capabilities:
            raise Unsupported(f"the {self.name} backend has no egress allow-list (network 'proxy')")
        if spec.allow and spec.network != "proxy":
            raise InvalidInput("an allow-list only applies with network 'proxy' (the other modes reach nothing "
                               f"or everything); got network {spec.network!r}")
        if not spec.limits.is_empty() and Capability.LIMITS not in self.capabilities:
            raise Unsupported(f"the {self.name} backend cannot limit memory, processes, CPU or disk")

    @abstractmethod
    def open(self, name: str, spec: SandboxSpec | None = None) -> Sandbox:
        """Resume the persistent sandbox ``name`` or create it with ``spec``; the returned
        sandbox's ``created`` says which.

        Refuses to adopt an ephemeral sandbox, and (SpecMismatch, one line naming each field that
        differs with both values) one that exists with a spec other than ``spec`` (None: whatever
        it was made with). A backend may instead apply a field it can change in place, and logs a
        warning when it does; its document says which fields it compares, applies or cannot see."""

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
    def list(self) -> builtins.list[SandboxInfo]:
        """Every sandbox of this backend (persistent and ephemeral), as ``Sandbox.info`` describes it."""

    # the store on this machine (``store migrate|reclaim|unmount``): backends that keep one
    def migrate_store(self, *, stop_running: bool = False,
                      progress: Callable[[str], None] | None = None) -> builtins.list[str]:
        """Move every sandbox to the better store this machine can have now (the local backend: a
        copy store to btrfs); returns the names moved, empty when there is nothing to do."""
        raise Unsupported(f"the {self.name} backend keeps no store on this machine")

    def disk_usage(self) -> StoreUsage:
        """What the store on this machine and each sandbox in it take on disk (``df``)."""
        raise Unsupported(f"the {self.name} backend keeps no store on this machine")

    def reclaim_store(self) -> int:
        """Give the space of deleted sandboxes back to the host disk now; returns the bytes."""
        raise Unsupported(f"the {self.name} backend keeps no store on this machine")

    def unmount_store(self) -> bool:
        """Unmount the store (no sandbox may run); the next use mounts it again. False when it was
        not mounted."""
        raise Unsupported(f"the {self.name} backend keeps no store on this machine")

    def doctor(self) -> builtins.list[DoctorCheck]:
        """What this machine has and lacks for this backend, one check per line of ``doctor``;
        changes nothing. Empty where the backend has nothing to check."""
        return []
