"""One E2B sandbox behind the contract: commands, files, pause, snapshots as checkpoints."""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import json
import logging
import math
import re
import shlex
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar

import e2b

from hermes_sandboxes import allowlist as policy
from hermes_sandboxes.backends.e2b.identity import (
    ALLOW_KEY,
    CREATED_KEY,
    EPHEMERAL_KEY,
    NAME_KEY,
    NETWORK_KEY,
    lease_request,
    lifecycle,
)
from hermes_sandboxes.backends.e2b.network import Posture, allow_in_effect, egress_rules
from hermes_sandboxes.backends.e2b.process import TAG_ENV, E2BProcess, kill_pid
from hermes_sandboxes.backends.e2b.process import tagged as _tagged
from hermes_sandboxes.errors import (
    CheckpointNotFound,
    InvalidInput,
    SandboxError,
)
from hermes_sandboxes.sandbox import (
    Checkpoint,
    Command,
    ExecResult,
    OutputSink,
    Process,
    Sandbox,
    SandboxInfo,
    SandboxState,
    Stdin,
    check_tag,
)

if TYPE_CHECKING:
    from hermes_sandboxes.backends.e2b.backend import E2BBackend

T = TypeVar("T")
log = logging.getLogger(__name__)
SNAPSHOT_PREFIX = "hs-"
CHECKPOINT_INDEX = ".cache/hermes-sandboxes/checkpoints.json"  # comments, under the sandbox's home
ALLOW_INDEX = ".cache/hermes-sandboxes/allow.json"  # the allow-list's entries as last set


def posture_in(metadata: Mapping[str, str]) -> Posture:
    """The network posture a sandbox was made with, from its metadata."""
    mode = metadata.get(NETWORK_KEY)
    if mode == "proxy":
        return Posture(internet=False, allow=tuple(metadata.get(ALLOW_KEY, "").split()))
    return Posture(internet=mode == "host")


def info_of(s: e2b.SandboxInfo) -> SandboxInfo:
    created = s.metadata.get(CREATED_KEY)
    return SandboxInfo(
        name=s.metadata.get(NAME_KEY, s.sandbox_id), backend="e2b",
        ephemeral=s.metadata.get(EPHEMERAL_KEY) == "true",
        state=SandboxState.RUNNING if s.state == e2b.SandboxState.RUNNING else SandboxState.PAUSED,
        created_at=float(created) if created else s.started_at.timestamp(),
        spec=posture_in(s.metadata).spec())


class E2BSandbox(Sandbox):
    def __init__(self, backend: E2BBackend, sdk: e2b.Sandbox, name: str, scope: str, *, ephemeral: bool,
                 created: bool, posture: Posture, lease_until: float = 0.0) -> None:
        self._backend = backend
        self._sdk = sdk
        self.name = name
        self.scope = scope
        self.ephemeral = ephemeral
        self.created = created
        self.home = "/home/user"
        self.posture = posture  # how it reaches the network (kept across restores and forks)
        self._local = threading.local()
        self._lease_lock = threading.Lock()
        self._lease_until = lease_until  # monotonic; the lease surely lasts until then (0: unknown)

    @property
    def backend(self) -> E2BBackend:
        return self._backend

    @property
    def sdk(self) -> e2b.Sandbox:
        """The SDK's handle on this sandbox (replaced when a resume brings new envd credentials)."""
        return self._sdk

    @property
    def sandbox_id(self) -> str:
        return str(self._sdk.sandbox_id)

    def call(self, what: str, fn: Callable[[], T]) -> T:
        return self._backend.call(f"{what} (sandbox {self.name}, {self.sandbox_id})", fn)

    def extend_lease(self, seconds: int) -> None:
        """Extend-only: a running sandbox keeps the longer of its lease and ``seconds``; a paused one
        resumes with a lease of ``seconds``. The SDK object is replaced, since a resumed sandbox may
        have new envd credentials. Afterwards the lease surely lasts ``seconds`` from when the request
        was sent: that is the new bound (never the old one, which a pause may have voided)."""
        sandbox_id = self.sandbox_id
        asked = time.monotonic()
        self._sdk = self.call("extend the lease", lambda: e2b.Sandbox.connect(
            sandbox_id, timeout=seconds, **self._backend.opts))
        with self._lease_lock:
            self._lease_until = asked + seconds

    def _renew_for(self, seconds: int) -> None:
        """Make sure the lease lasts ``seconds`` from now before a command starts. The bound kept
        from the last extension decides: when it covers them, no request is made; otherwise the
        extension completes first, asking for the headroom on top, so the commands of the next
        moments find their lease covered too."""
        self._local.need = seconds  # what a resume on the command's way must ask for
        with self._lease_lock:
            covered = self._lease_until - time.monotonic() >= seconds
        if not covered:
            self.extend_lease(lease_request(seconds))

    def _resuming(self, what: str, fn: Callable[[], T], need: int | None = None) -> T:
        """``fn`` against envd; a sandbox found paused (by another process's stop(), or its lease
        running out) is resumed with the extend-only connect, asking for ``need`` seconds (default
        the lease), and ``fn`` tried once more."""
        try:
            return self.call(what, fn)
        except SandboxError as exc:
            if not isinstance(exc.__context__, e2b.SandboxNotRunningException):
                raise
        self.extend_lease(lease_request(need or self._need(None)))
        return self.call(what, fn)

    def _need(self, timeout: float | None) -> int:
        """The lease a command needs from its start: max(lease, timeout + grace)."""
        lease = self._backend.lease(self.ephemeral)
        if timeout is None:
            return lease
        return max(lease, math.ceil(timeout) + 1 + self._backend.settings.command_grace_seconds)

    def reserve(self, seconds: float) -> None:
        """The caller's next command on this thread may run ``seconds``: the lease covers them and
        the grace before this returns (and again should the command find the sandbox paused)."""
        self._local.reserved = self._need(seconds)
        self._renew_for(self._local.reserved)

    def info(self) -> SandboxInfo:
        detail = self.call("describe", lambda: self._sdk.get_info())
        info = info_of(detail)
        if info.spec.network != "proxy":
            return info
        actual = tuple((detail.network or {}).get("allow_out") or ())
        recorded = self._recorded_allow()
        # no entries set since creation: those it was made with (its metadata), as written
        in_force = allow_in_effect(recorded if recorded is not None else info.spec.allow, actual)
        if allow_in_effect(self.posture.allow, actual) != self.posture.allow:
            # opened with another list than E2B enforces (changed by another process): a restore or
            # fork must carry the list in force
            self.posture = Posture(False, in_force)
        return dataclasses.replace(info, spec=Posture(False, in_force).spec())

    # the network -----------------------------------------------------------------------------------
    def set_allow(self, allow: Sequence[str]) -> None:
        """Replace the egress rules of a "proxy" sandbox with ``update_network``: open connections
        keep going, new ones meet the new rules. The entries are kept in a small file inside the
        sandbox, for ``info()`` (which shows E2B's own rules instead should the two disagree)."""
        if self.posture.allow is None:
            raise InvalidInput(f"sandbox {self.name} has network {self.posture.label!r}; an allow-list applies "
                               "only to network 'proxy' (create the sandbox with one)")
        entries = policy.validate(allow)
        rules = egress_rules(entries)
        self._renew_for(self._need(None))  # a paused sandbox takes no network update
        self.call("change the egress rules", lambda: self._sdk.update_network(
            {"allow_out": rules["allow_out"], "deny_out": rules["deny_out"]}))
        self.posture = Posture(internet=False, allow=entries)
        self._save_allow(entries)

    def _recorded_allow(self) -> tuple[str, ...] | None:
        """The entries as last set (None: never set, or unreadable)."""
        try:
            data = json.loads(self.read_file(f"{self.home}/{ALLOW_INDEX}"))
        except (SandboxError, ValueError):
            return None
        return tuple(str(e) for e in data) if isinstance(data, list) else None

    def _save_allow(self, entries: Sequence[str]) -> None:
        self.write_file(f"{self.home}/{ALLOW_INDEX}", json.dumps(list(entries)).encode())

    # commands ------------------------------------------------------------------------------------
    def exec(self, command: Command, *, cwd: str | None = None, env: Mapping[str, str] | None = None,
             stdin: Stdin = None, timeout: float | None = None, on_stdout: OutputSink | None = None,
             on_stderr: OutputSink | None = None, capture_limit: int = 256 * 1024,
             tag: str | None = None) -> ExecResult:
        settings = self._backend.settings
        self._renew_for(self._need(timeout))
        # the stream's own deadline is a safety net should this host vanish mid-command
        self._local.deadline = None if timeout is None else timeout + settings.command_grace_seconds
        try:
            return super().exec(command, cwd=cwd, env=env, stdin=stdin, timeout=timeout, on_stdout=on_stdout,
                                on_stderr=on_stderr, capture_limit=capture_limit, tag=tag)
        finally:
            self._local.deadline = None

    def start(self, command: Command, *, cwd: str | None = None, env: Mapping[str, str] | None = None,
              stdin: Stdin = None, on_stdout: OutputSink | None = None,
              on_stderr: OutputSink | None = None, tag: str | None = None) -> Process:
        reserved, self._local.reserved = getattr(self._local, "reserved", 0), 0
        self._renew_for(max(self._need(None), reserved))
        return self._launch(command, cwd, _tagged(env, tag), stdin, on_stdout, on_stderr, None)

    def _start_for_exec(self, command: Command, *, cwd: str | None, env: Mapping[str, str] | None,
                        stdin: Stdin, on_stdout: OutputSink, on_stderr: OutputSink,
                        tag: str | None = None) -> Process:
        return self._launch(command, cwd, _tagged(env, tag), stdin, on_stdout, on_stderr,
                            getattr(self._local, "deadline", None))

    def kill_tagged(self, tag: str) -> bool:
        """envd lists each running command with the environment it was started with: the one whose
        ``TAG_ENV`` is ``tag`` is killed (its process group, then its pid, as ``Process.kill``). A
        paused sandbox runs nothing (its pause ended every process)."""
        check_tag(tag)
        sdk = self._sdk
        try:
            running = self.call("list commands", lambda: sdk.commands.list())
        except SandboxError as exc:
            if isinstance(exc.__context__, e2b.SandboxNotRunningException):
                return False
            raise
        pids = [int(p.pid) for p in running if (p.envs or {}).get(TAG_ENV) == tag]
        for pid in pids:
            kill_pid(self, pid)
        return bool(pids)

    def _launch(self, command: Command, cwd: str | None, env: Mapping[str, str] | None, stdin: Stdin,
                on_stdout: OutputSink | None, on_stderr: OutputSink | None, deadline: float | None) -> E2BProcess:
        if isinstance(command, str):
            line = command
        else:
            argv = [str(a) for a in command]
            if not argv:
                raise InvalidInput("empty command: give a program to run")
            line = shlex.join(argv)
        if cwd is not None and not cwd.startswith("/"):
            raise InvalidInput(f"working directory must be absolute, got {cwd!r}")
        def run() -> Any:
            return self._sdk.commands.run(line, background=True, envs=dict(env or {}),
                                          cwd=cwd or self._backend.settings.cwd, stdin=stdin is not None,
                                          timeout=deadline or 0, retain_output=False)

        handle = self._resuming("start a command", run, getattr(self._local, "need", None))
        sdk = self._sdk
        if isinstance(stdin, bytes):
            self.call("send input", lambda: sdk.commands.send_stdin(handle.pid, stdin))
            self.call("close input", lambda: sdk.commands.close_stdin(handle.pid))
        elif stdin is not None:  # a stream: passed on chunk by chunk beside the command (contract)
            threading.Thread(target=self._feed, args=(sdk, handle.pid, stdin), daemon=True).start()
        return E2BProcess(self, handle, on_stdout, on_stderr)

    def _send(self, sdk: Any, pid: int, chunk: bytes) -> None:
        self.call("send input", lambda: sdk.commands.send_stdin(pid, chunk))

    def _feed(self, sdk: Any, pid: int, source: BinaryIO) -> None:
        read = getattr(source, "read1", source.read)
        with contextlib.suppress(SandboxError, OSError, ValueError):  # the command ended first
            while chunk := read(65536):
                self._send(sdk, pid, chunk)
            self.call("close input", lambda: sdk.commands.close_stdin(pid))

    # files ---------------------------------------------------------------------------------------
    @staticmethod
    def _absolute(path: str) -> str:
        if not path.startswith("/"):
            raise InvalidInput(f"sandbox paths must be absolute, got {path!r}")
        return path

    def read_file(self, path: str) -> bytes:
        path = self._absolute(path)
        return bytes(self._resuming(f"read {path}", lambda: self._sdk.files.read(path, format="bytes")))

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        path = self._absolute(path)
        self._resuming(f"write {path}", lambda: self._sdk.files.write(path, data, use_octet_stream=True))
        if mode != 0o644:  # envd writes 0644; anything else costs one more round trip
            self.call(f"chmod {path}", lambda: self._sdk.commands.run(
                shlex.join(["chmod", f"{mode:o}", "--", path]), timeout=60))

    def delete_file(self, path: str) -> None:
        path = self._absolute(path)
        self._resuming(f"delete {path}", lambda: self._sdk.files.remove(path))

    # lifecycle -----------------------------------------------------------------------------------
    def stop(self) -> None:
        """Pause: the files stay, processes end (a filesystem-only pause). The next command resumes."""
        sandbox_id = self.sandbox_id
        with self._lease_lock:
            self._lease_until = 0.0  # the next command resumes it before it starts
        self.call("pause", lambda: e2b.Sandbox.pause(sandbox_id, **self._backend.opts))

    def destroy(self) -> None:
        """Kill the sandbox and delete its checkpoints. Idempotent."""
        for checkpoint in self.checkpoints():
            self.delete_checkpoint(checkpoint.id)
        sandbox_id = self.sandbox_id
        self.call("kill", lambda: e2b.Sandbox.kill(sandbox_id, **self._backend.opts))

    # checkpoints ---------------------------------------------------------------------------------
    def _snapshot_prefix(self) -> str:
        return f"{SNAPSHOT_PREFIX}{self.scope[:16]}-"

    def _comments(self) -> dict[str, str]:
        try:
            raw = self.read_file(f"{self.home}/{CHECKPOINT_INDEX}")
            data = json.loads(raw)
        except (SandboxError, ValueError):
            return {}
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def _save_comments(self, comments: Mapping[str, str]) -> None:
        self.write_file(f"{self.home}/{CHECKPOINT_INDEX}", json.dumps(dict(comments)).encode())

    def checkpoint(self, comment: str = "") -> Checkpoint:
        created = time.time()
        name = f"{self._snapshot_prefix()}{int(created * 1000)}"
        snapshot = self.call("snapshot", lambda: self._sdk.create_snapshot(name=name))
        if comment:
            self._save_comments({**self._comments(), snapshot.snapshot_id: comment})
        return Checkpoint(id=snapshot.snapshot_id, created_at=created, comment=comment)

    def _snapshots(self) -> Iterator[tuple[str, float]]:
        def query() -> builtins.list[e2b.SnapshotInfo]:
            pages = e2b.Sandbox.list_snapshots(**self._backend.opts)
            found: builtins.list[e2b.SnapshotInfo] = []
            while pages.has_next:
                found += pages.next_items()
            return found

        prefix = self._snapshot_prefix()
        for snap in self.call("list snapshots", query):
            for name in snap.names:
                match = re.fullmatch(re.escape(prefix) + r"(\d+)", name.split("/")[-1].split(":")[0])
                if match:
                    yield snap.snapshot_id, int(match.group(1)) / 1000
                    break

    def checkpoints(self) -> builtins.list[Checkpoint]:
        snaps = sorted(self._snapshots(), key=lambda s: s[1])
        comments = self._comments() if snaps else {}
        return [Checkpoint(id=i, created_at=t, comment=comments.get(i, "")) for i, t in snaps]

    def restore(self, checkpoint_id: str) -> None:
        """Replace the sandbox with a new one created from the snapshot, with the same identity. The
        old one is killed only once the new one runs, so a failure leaves the sandbox as it was."""
        if checkpoint_id not in dict(self._snapshots()):
            raise CheckpointNotFound(f"sandbox {self.name} has no checkpoint {checkpoint_id!r}", sandbox=self.name)
        comments = self._comments()
        backend = self._backend
        # the replacement carries the very metadata of the sandbox it replaces: identity, labels, age
        metadata = dict(self.call("describe", self._sdk.get_info).metadata)
        lease, asked = lease_request(backend.lease(self.ephemeral)), time.monotonic()
        new = self.call("restore", lambda: e2b.Sandbox.create(
            template=checkpoint_id, timeout=lease, metadata=metadata, **self.posture.create_options(),
            lifecycle=lifecycle(not self.ephemeral), **backend.opts))
        old_id, self._sdk = self.sandbox_id, new
        with self._lease_lock:
            self._lease_until = asked + lease  # the replacement's own lease, not the old one's
        with contextlib.suppress(SandboxError):
            self.call("kill the replaced sandbox", lambda: e2b.Sandbox.kill(old_id, **backend.opts))
        if comments:
            self._save_comments(comments)
        if self.posture.allow is not None:  # the snapshot may hold an older list than the one in force
            self._save_allow(self.posture.allow)

    def fork(self, new_name: str, checkpoint_id: str | None = None) -> E2BSandbox:
        """A new persistent sandbox from checkpoint ``checkpoint_id``, or from a snapshot of this
        sandbox taken now (deleted again once the fork runs). This sandbox is untouched."""
        if checkpoint_id is not None:
            if checkpoint_id not in dict(self._snapshots()):
                raise CheckpointNotFound(f"sandbox {self.name} has no checkpoint {checkpoint_id!r}", sandbox=self.name)
            return self._backend.fork(self, new_name, checkpoint_id)
        name = f"{SNAPSHOT_PREFIX}fork-{self.scope[:16]}-{int(time.time() * 1000)}"
        snapshot = self.call("snapshot", lambda: self._sdk.create_snapshot(name=name))
        try:
            return self._backend.fork(self, new_name, snapshot.snapshot_id)
        finally:
            with contextlib.suppress(SandboxError):
                self.call("delete the fork's snapshot", lambda: e2b.Sandbox.delete_snapshot(
                    snapshot.snapshot_id, **self._backend.opts))

    def delete_checkpoint(self, checkpoint_id: str) -> None:
        if not self.call("delete snapshot", lambda: e2b.Sandbox.delete_snapshot(checkpoint_id,
                                                                                 **self._backend.opts)):
            raise CheckpointNotFound(f"sandbox {self.name} has no checkpoint {checkpoint_id!r}", sandbox=self.name)
