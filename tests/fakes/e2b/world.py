"""The state behind the fake E2B: sandboxes (each a real local sandbox), their processes, snapshots,
the request log and the faults a test arms.

Everything here is plain threads and locks; the asyncio side (server.py, envd.py, control.py) reaches
it through ``Subscriber`` queues, whose bounded size carries back-pressure from a slow client all the
way to the command's pipe, as a real envd would.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import re
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from hermes_sandboxes.backends.local import LocalBackend, LocalSandbox
from hermes_sandboxes.names import unique_name
from hermes_sandboxes.sandbox import ChangeKind, Process, Sandbox, SandboxSpec

ENVD_VERSION = "0.6.4"  # new enough for stdin close, octet-stream uploads and file metadata
HOME = "/home/user"  # where E2B templates put the default user's home
DEFAULT_TIMEOUT_S = 15  # the API's lease when a create names none
QUEUE_DEPTH = 64  # chunks in flight per stream: bounded, so a slow reader slows the command


def iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1e6):06d}Z"


@dataclass
class Recorded:
    """One request as the fake received it (headers lower-cased)."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    sandbox_id: str | None = None
    body: Any = None  # parsed JSON of a control-plane call, or a summary of an envd RPC

    @property
    def rpc(self) -> str | None:
        """``Process/Start``-style name of an envd RPC, else None."""
        match = re.fullmatch(r"/(?:process|filesystem)\.(\w+)/(\w+)", self.path)
        return f"{match.group(1)}/{match.group(2)}" if match else None


@dataclass
class Fault:
    """A canned failure for the next ``times`` requests matching ``method`` and ``path`` (a regex)."""

    method: str
    path: str
    kind: str  # "status": answer status/body; "drop": cut the response; "drop_stream": cut after `after` events;
    # "call": call `callback` when the request arrives, then serve it normally
    status: int = 500
    body: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    after: int = 0
    times: int = 1
    callback: Callable[[], None] | None = None

    def matches(self, method: str, path: str) -> bool:
        return self.times > 0 and method == self.method and re.fullmatch(self.path, path) is not None


class Subscriber:
    """One stream's view of a process: a bounded queue fed from the process's threads."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(maxsize=QUEUE_DEPTH)
        self.closed = False

    def put(self, item: tuple[str, Any]) -> None:
        """Called from a non-loop thread; blocks while the queue is full (back-pressure)."""
        if self.closed or self.loop.is_closed():
            return
        future = asyncio.run_coroutine_threadsafe(self.queue.put(item), self.loop)
        while True:
            try:
                future.result(timeout=0.5)
                return
            except TimeoutError:
                if self.closed or self.loop.is_closed():
                    future.cancel()
                    return
            except Exception:  # the loop went away
                return

    def close(self) -> None:
        """On the loop: stop taking items and free a writer blocked on a full queue."""
        self.closed = True
        while not self.queue.empty():
            self.queue.get_nowait()


@dataclass
class End:
    exit_code: int
    exited: bool
    status: str
    error: str | None


class FakeProcess:
    """A command of a fake sandbox, run by its local sandbox. Its pid is the fake's own number."""

    def __init__(self, pid: int, argv: list[str], env: dict[str, str], cwd: str | None, tag: str | None) -> None:
        self.pid, self.argv, self.env, self.cwd, self.tag = pid, argv, env, cwd, tag
        self.local: Process | None = None
        self.stdin: bytearray | None = None  # input gathered until CloseStdin launches the command
        self.subscribers: list[Subscriber] = []
        self.killed = False
        self.end: End | None = None
        self.done = threading.Event()
        self.lock = threading.Lock()

    def emit(self, item: tuple[str, Any]) -> None:
        with self.lock:
            subscribers = list(self.subscribers)
        for sub in subscribers:
            sub.put(item)

    def launch(self, sandbox: Sandbox, stdin: bytes | None) -> None:
        """Blocking: start the command in the local sandbox and a thread that reports its end."""
        self.local = sandbox.start(self.argv, cwd=self.cwd, env=self.env, stdin=stdin,
                                   on_stdout=lambda b: self.emit(("stdout", b)),
                                   on_stderr=lambda b: self.emit(("stderr", b)))
        threading.Thread(target=self._reap, name=f"fake-e2b-pid{self.pid}", daemon=True).start()

    def _reap(self) -> None:
        assert self.local is not None
        try:
            code = self.local.wait()
        except Exception as exc:
            end = End(-1, False, "error", str(exc))
        else:
            if self.killed:  # what Go's os/exec reports for a process killed by a signal
                end = End(-1, False, "signal: killed", "signal: killed")
            else:
                end = End(code if code is not None else -1, True, f"exit status {code}", None)
        self.end = end
        self.done.set()  # before the end event: a client that saw it may list processes at once
        self.emit(("end", end))

    def kill(self) -> None:
        """Blocking: SIGKILL the command and everything it started."""
        self.killed = True
        if self.local is not None:
            self.local.kill()
        elif not self.done.is_set():  # never launched (stdin still open)
            self.end = End(-1, False, "signal: killed", "signal: killed")
            self.done.set()
            self.emit(("end", self.end))

    @property
    def running(self) -> bool:
        return not self.done.is_set()


@dataclass
class Snapshot:
    snapshot_id: str
    names: list[str]
    source_id: str
    template_id: str
    archive: bytes  # tar of what the source sandbox had added or changed since it was made
    deleted: list[str]
    created_at: float = field(default_factory=time.time)


@dataclass
class FakeSandbox:
    sandbox_id: str
    template_id: str
    local: LocalSandbox
    base_checkpoint: str  # the local checkpoint taken right after creation: snapshots diff from it
    metadata: dict[str, str]
    envs: dict[str, str]
    auto_pause: bool
    auto_pause_memory: bool | None
    allow_internet_access: bool | None
    timeout_s: int
    network: dict[str, list[str]]  # the egress rules as the API keeps them: allowOut, denyOut
    access_token: str
    started_at: float = field(default_factory=time.time)
    end_at: float = 0.0
    state: str = "running"  # or "paused"
    processes: dict[int, FakeProcess] = field(default_factory=dict)
    # envd's pids are the fake's own numbers, above any real pid_max, so a `kill -- -PID` aimed at
    # one inside the local sandbox can never hit a real process there
    pids: Any = field(default_factory=lambda: itertools.count(10_000_000))

    def listed(self) -> dict[str, Any]:
        return {
            "templateID": self.template_id, "sandboxID": self.sandbox_id, "clientID": "fake",
            "startedAt": iso(self.started_at), "endAt": iso(self.end_at), "cpuCount": 2, "memoryMB": 512,
            "diskSizeMB": 1024, "metadata": dict(self.metadata), "state": self.state,
            "envdVersion": ENVD_VERSION,
        }

    def created(self) -> dict[str, Any]:
        return {"templateID": self.template_id, "sandboxID": self.sandbox_id, "clientID": "fake",
                "envdVersion": ENVD_VERSION, "envdAccessToken": self.access_token, "domain": None}


class InvalidRules(ValueError):
    """Egress rules the API refuses (HTTP 400)."""


def _ipv4_network(text: str) -> bool:
    try:
        ipaddress.IPv4Network(text, strict=False)
    except ValueError:
        return False
    return True


def egress_rules(network: Any) -> dict[str, list[str]]:
    """The ``allowOut``/``denyOut`` of a create or update body, checked as the API documents them:
    allowed entries are IPv4 addresses or networks, names or ``*.domain`` wildcards (a bare ``*``
    is invalid); denied entries are addresses or networks only."""
    if not network:
        return {"allowOut": [], "denyOut": []}
    allow, deny = list(network.get("allowOut") or []), list(network.get("denyOut") or [])
    for entry in allow:
        name = entry[2:] if entry.startswith("*.") else entry
        if not _ipv4_network(entry) and not re.fullmatch(r"[a-z0-9_-]+(\.[a-z0-9_-]+)*", name):
            raise InvalidRules(f"allowOut entry {entry!r} is neither an IPv4 address, a CIDR block nor a domain")
    for entry in deny:
        if not _ipv4_network(entry):
            raise InvalidRules(f"denyOut entry {entry!r}: domain names are not supported for deny rules")
    return {"allowOut": allow, "denyOut": deny}


def local_spec(network: dict[str, list[str]]) -> SandboxSpec:
    """How the fake enforces E2B's rules: a sandbox whose rules deny everything but a list is a local
    "proxy" sandbox allowed exactly those destinations on every port (as E2B allows them), so a
    command inside reaches what the rules allow and nothing else. Any other sandbox of the fake has
    no network at all (its internet stays a recorded flag)."""
    if "0.0.0.0/0" not in network["denyOut"]:
        return SandboxSpec()
    return SandboxSpec(network="proxy", allow=local_allow(network))


def local_allow(network: dict[str, list[str]]) -> tuple[str, ...]:
    return tuple(f"{entry}:*" for entry in network["allowOut"])


class World:
    """All sandboxes and snapshots of one fake E2B account, backed by one local backend."""

    def __init__(self, backend: LocalBackend, executor: Executor) -> None:
        self.backend = backend
        self.executor = executor
        self.lock = threading.RLock()
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.snapshots: dict[str, Snapshot] = {}
        self.templates = {"base"}
        self.requests: list[Recorded] = []
        self.faults: list[Fault] = []
        self.clock: Callable[[], float] = time.time

    # faults --------------------------------------------------------------------------------------
    def take_fault(self, method: str, path: str, kinds: tuple[str, ...]) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.kind in kinds and fault.matches(method, path):
                    fault.times -= 1
                    return fault
        return None

    # sandboxes -----------------------------------------------------------------------------------
    def get(self, sandbox_id: str) -> FakeSandbox | None:
        self.sweep()
        with self.lock:
            return self.sandboxes.get(sandbox_id)

    def sweep(self) -> None:
        """Apply the on-timeout action to every sandbox whose lease ran out (as E2B does on its own)."""
        now = self.clock()
        with self.lock:
            expired = [s for s in self.sandboxes.values() if s.state == "running" and s.end_at <= now]
        for sb in expired:
            self.expire(sb)

    def expire(self, sb: FakeSandbox) -> None:
        if sb.auto_pause:
            self.pause(sb)
        else:
            self.kill(sb)

    def create(self, body: dict[str, Any]) -> FakeSandbox:
        """Blocking. ``body`` is a validated create request; its template may be a snapshot id."""
        template = str(body["templateID"])
        snapshot = self.snapshots.get(template)
        network = egress_rules(body.get("network"))
        local = self.backend.create(unique_name("e2b"), local_spec(network))
        try:
            local.exec(["mkdir", "-p", HOME], timeout=30)
            base = local.checkpoint("fake e2b: as created").id
            if snapshot is not None:
                self._apply_snapshot(local, snapshot)
        except BaseException:
            local.destroy()
            raise
        timeout = int(body.get("timeout") or DEFAULT_TIMEOUT_S)
        sb = FakeSandbox(
            sandbox_id="i" + secrets.token_hex(10), template_id=template, local=local, base_checkpoint=base,
            metadata=dict(body.get("metadata") or {}), envs=dict(body.get("envVars") or {}),
            auto_pause=bool(body.get("autoPause", False)), auto_pause_memory=body.get("autoPauseMemory"),
            allow_internet_access=body.get("allow_internet_access"), timeout_s=timeout,
            network=network,
            access_token=secrets.token_urlsafe(16),
        )
        sb.started_at = self.clock()
        sb.end_at = sb.started_at + timeout
        with self.lock:
            self.sandboxes[sb.sandbox_id] = sb
        return sb

    def connect(self, sb: FakeSandbox, timeout: int | None) -> bool:
        """Blocking. Resume a paused sandbox (True) or extend a running one's lease, never shorten it."""
        now = self.clock()
        lease = timeout if timeout is not None else sb.timeout_s
        with self.lock:
            resumed = sb.state == "paused"
            sb.state = "running"
            sb.end_at = now + lease if resumed else max(sb.end_at, now + lease)
        return resumed

    def pause(self, sb: FakeSandbox) -> None:
        """Blocking. A pause without memory: the files stay, every process dies."""
        with self.lock:
            sb.state = "paused"
            procs = list(sb.processes.values())
            sb.processes.clear()
        for proc in procs:
            if proc.running:
                proc.kill()
        with contextlib.suppress(Exception):
            sb.local.stop()

    def kill(self, sb: FakeSandbox) -> None:
        """Blocking. Remove the sandbox and its local sandbox; its snapshots stay."""
        with self.lock:
            if self.sandboxes.pop(sb.sandbox_id, None) is None:
                return
            procs = list(sb.processes.values())
        for proc in procs:
            with contextlib.suppress(Exception):
                if proc.running:
                    proc.kill()
        sb.local.destroy()

    # snapshots -----------------------------------------------------------------------------------
    def snapshot(self, sb: FakeSandbox, name: str | None) -> Snapshot:
        """Blocking. Capture what the sandbox changed since it was made (a full-filesystem snapshot)."""
        local = sb.local
        checkpoint = local.checkpoint("fake e2b: snapshot").id
        try:
            changes = local.diff(sb.base_checkpoint, checkpoint)
        finally:
            local.delete_checkpoint(checkpoint)
        present = [c.path for c in changes if c.kind != ChangeKind.DELETED]
        deleted = [c.path for c in changes if c.kind == ChangeKind.DELETED]
        archive = bytearray()
        if present:
            listing = "".join(p.lstrip("/") + "\0" for p in present).encode()
            result = local.exec(["tar", "-C", "/", "--null", "--no-recursion", "-T", "-", "-cf", "-"],
                                stdin=listing, on_stdout=archive.extend, timeout=300)
            if result.exit_code != 0:
                raise RuntimeError(f"snapshot tar failed: {result.stderr}")
        with self.lock:
            existing = next((s for s in self.snapshots.values() if name and name in s.names), None)
            snapshot_id = existing.snapshot_id if existing else "snap-" + secrets.token_hex(8)
            snap = Snapshot(snapshot_id, [name] if name else [], sb.sandbox_id, sb.template_id,
                            bytes(archive), deleted)
            self.snapshots[snapshot_id] = snap
        return snap

    @staticmethod
    def _apply_snapshot(local: Sandbox, snap: Snapshot) -> None:
        if snap.archive:
            result = local.exec(["tar", "-C", "/", "-xpf", "-"], stdin=snap.archive, timeout=300)
            if result.exit_code != 0:
                raise RuntimeError(f"snapshot restore failed: {result.stderr}")
        if snap.deleted:
            local.exec(["rm", "-rf", "--", *snap.deleted], timeout=300)

    # cleanup -------------------------------------------------------------------------------------
    def close(self) -> list[str]:
        """Kill every sandbox; return what could not be cleaned up."""
        errors = []
        with self.lock:
            sandboxes = list(self.sandboxes.values())
        for sb in sandboxes:
            try:
                self.kill(sb)
            except Exception as exc:
                errors.append(f"{sb.sandbox_id}: {exc}")
        return errors
