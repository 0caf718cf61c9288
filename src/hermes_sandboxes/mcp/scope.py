"""Which sandboxes one MCP server may touch, and how it reaches them through the recorder.

By default a server's sandboxes live under a name prefix (``mcp-``): a name the model gives
without it gets it (``web`` is ``mcp-web``), and a sandbox outside the prefix is refused, so a model
cannot run commands in, restore or remove the user's other sandboxes. ``pinned`` narrows that to
one sandbox (created on first use if it does not exist), whatever its name.

Every sandbox is used as a ``RecordedSandbox`` built by the host state's one factory, with the
settings the backend's configuration gives (automatic checkpoint policy, retention, protected
paths, health command, per-command credentials looked up in the server's environment): the MCP
server's commands land in the same journal and audit log as the CLI's and Hermes's.

Ephemeral sandboxes belong to the client session that created them and are destroyed when it
ends. Each is claimed in the backend's owners directory (the CLI's ``run`` does the same) before
it is created, so a server killed with them still alive leaves them to ``gc`` and to the next CLI
call that uses the backend.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading

from hermes_sandboxes.errors import InvalidInput, SandboxError, SandboxNotFound
from hermes_sandboxes.mcp.tools import ToolError
from hermes_sandboxes.util.values import dataclass

TYPE_CHECKING = False  # (typing.TYPE_CHECKING without importing typing: the server's start-up is measured)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, Protocol

    from hermes_sandboxes.recorder.credentials import Redactor
    from hermes_sandboxes.recorder.journal import Journal
    from hermes_sandboxes.recorder.sandbox import RecordedSandbox
    from hermes_sandboxes.recorder.state import HostState
    from hermes_sandboxes.sandbox import Backend, Sandbox, SandboxInfo, SandboxSpec
    from hermes_sandboxes.settings import BackendSettings

DEFAULT_PREFIX = "mcp"


if TYPE_CHECKING:

    class OwnerBook(Protocol):
        """Where ephemeral sandboxes are claimed by the process that made them (``cli/owners.py``)."""

        def claim(self, name: str) -> None: ...

        def release(self, name: str) -> None: ...


@dataclass(frozen=True)
class Host:
    """What the face starting the server hands in; each part is built on first use, so that
    ``initialize`` is answered before any backend or settings model is imported."""

    backend: Callable[[], Backend]
    state: Callable[[], HostState]
    settings: Callable[[], BackendSettings]
    owners: Callable[[], OwnerBook]


@dataclass(frozen=True)
class Rules:
    prefix: str = DEFAULT_PREFIX
    pinned: str | None = None  # the one sandbox this server serves
    allow_network_changes: bool = False  # the network_allow tool is offered only with this


@dataclass()
class OpenSandbox:
    """A sandbox this server uses, with its recorder (kept open: one journal per sandbox)."""

    recorded: RecordedSandbox
    redactor: Redactor
    lock: threading.Lock


class Scope:
    def __init__(self, host: Host, rules: Rules) -> None:
        self.host = host
        self.rules = rules
        self._lock = threading.Lock()
        self._open: dict[str, OpenSandbox] = {}
        self._ephemeral: dict[str, str] = {}  # sandbox -> the session that owns it
        self._audit: Journal | None = None
        self._redactor: Redactor | None = None

    # -- names ---------------------------------------------------------------------------------

    def full_name(self, name: str | None) -> str:
        """The backend's name for what the model called ``name``; refuses names out of scope."""
        from hermes_sandboxes.names import validate_name

        pinned = self.rules.pinned
        if pinned is not None:
            if name in (None, "", pinned):
                return pinned
            raise ToolError(f"this server serves only sandbox {pinned}; leave 'sandbox' out or give {pinned!r}")
        if not name:
            raise ToolError("give the sandbox's name ('sandbox'); sandbox_list shows them")
        prefix = f"{self.rules.prefix}-"
        full = name if name.startswith(prefix) else prefix + name
        return validate_name(full)

    def in_scope(self, name: str) -> bool:
        if self.rules.pinned is not None:
            return name == self.rules.pinned
        return name.startswith(f"{self.rules.prefix}-")

    def describe(self) -> str:
        if self.rules.pinned is not None:
            return f"only sandbox {self.rules.pinned}"
        return f"sandboxes named {self.rules.prefix}-*"

    # -- reaching sandboxes --------------------------------------------------------------------

    def use(self, name: str | None) -> OpenSandbox:
        """The sandbox the model named, through its recorder (SandboxNotFound if it does not exist;
        a pinned one is created on first use)."""
        full = self.full_name(name)
        with self._lock:
            found = self._open.get(full)
        if found is not None:
            return found
        backend = self.host.backend()
        if self.rules.pinned is not None:
            sandbox = self._open_pinned(backend, full, self.spec())
            opened = self._remember(sandbox)
            if sandbox.created:
                opened.recorded.record_create()
            return opened
        try:
            sandbox = backend.get(full)
        except SandboxNotFound:
            raise SandboxNotFound(f"there is no sandbox {full}; sandbox_list shows those of this server, "
                                  "sandbox_create makes one") from None
        return self._remember(sandbox)

    @staticmethod
    def _open_pinned(backend: Backend, name: str, spec: SandboxSpec) -> Sandbox:
        """The pinned sandbox: made with the settings' spec on first use; one that exists already
        is served as it is even when made with another spec (pinning names that sandbox), which
        the server's stderr (the client's log) says."""
        from hermes_sandboxes.errors import SpecMismatch

        try:
            return backend.open(name, spec)
        except SpecMismatch as exc:
            print(f"hermes-sandboxes mcp: {exc}; serving it as it is", file=sys.stderr, flush=True)
            return backend.open(name)

    def _remember(self, sandbox: Sandbox) -> OpenSandbox:
        from hermes_sandboxes.recorder.credentials import Redactor

        settings = self.host.settings()
        state = self.host.state()
        with self._lock:
            if self._redactor is None:  # one for the server: the audit log is shared by its sandboxes
                self._redactor = Redactor()
            redactor = self._redactor
            if self._audit is None:
                self._audit = state.audit(sandbox.backend, redactor.redact)
            audit = self._audit
        from hermes_sandboxes.hermes.sync import restores
        from hermes_sandboxes.recorder.options import Checkpointing, Credentials, Health, Retention

        recorded = state.recorded(
            sandbox, redact=redactor.redact, audit=audit,
            checkpointing=Checkpointing(settings.auto_checkpoint, tuple(settings.protected_paths)),
            retention=Retention(settings.retention, settings.retention_min_age, settings.retention_bytes),
            health=Health(settings.health_command),
            credentials=Credentials(dict(settings.credentials), os.environ.get, redactor),
            hooks=restores.hooks(state.root),  # a restore here is noted for Hermes sessions on the sandbox
            origin={"via": "mcp"})
        opened = OpenSandbox(recorded, redactor, threading.Lock())
        with self._lock:
            existing = self._open.setdefault(sandbox.name, opened)
        if existing is not opened:
            recorded.close()
        return existing

    def spec(self, **changes: Any) -> SandboxSpec:
        """The spec new sandboxes get: the settings' with ``changes`` laid over it."""
        from dataclasses import replace

        return replace(self.host.settings().spec(), **changes)

    def sandboxes(self) -> list[SandboxInfo]:
        return [info for info in self.host.backend().list() if self.in_scope(info.name)]

    # -- lifecycle -----------------------------------------------------------------------------

    def create(self, name: str | None, spec: SandboxSpec, *, ephemeral: bool, session: str) -> OpenSandbox:
        from hermes_sandboxes.names import unique_name

        if self.rules.pinned is not None:
            raise ToolError(f"this server serves only sandbox {self.rules.pinned}; it creates no others")
        backend = self.host.backend()
        if ephemeral:
            full = self.full_name(name) if name else unique_name(f"{self.rules.prefix}-tmp")
            owners = self.host.owners()
            owners.claim(full)  # first: from now on a killed server leaves it to gc
            try:
                sandbox = backend.create(full, spec, ephemeral=True)
            except BaseException:
                owners.release(full)
                raise
            with self._lock:
                self._ephemeral[full] = session
        else:
            sandbox = backend.create(self.full_name(name), spec)
        with self._lock:  # a sandbox of that name removed behind our back (the CLI's rm) is a new life
            stale = self._open.pop(sandbox.name, None)
        if stale is not None:
            stale.recorded.close()
        opened = self._remember(sandbox)
        opened.recorded.record_create()
        return opened

    def forked(self, sandbox: Sandbox, forked_from: str) -> OpenSandbox:
        opened = self._remember(sandbox)
        opened.recorded.record_create(forked_from=forked_from)
        return opened

    def remove(self, name: str) -> None:
        opened = self.use(name)
        with opened.lock:
            self._destroy(opened)

    def _destroy(self, opened: OpenSandbox) -> None:
        recorded = opened.recorded
        recorded.destroy()
        self._forget(recorded.name)
        if recorded.inner.ephemeral:
            with contextlib.suppress(FileNotFoundError):
                recorded.journal.path.unlink()  # its history stays in the audit log (as the CLI's run)

    def _forget(self, name: str) -> None:
        with self._lock:
            opened = self._open.pop(name, None)
            owned = self._ephemeral.pop(name, None)
        if opened is not None:
            opened.recorded.close()
        if owned is not None:
            self.host.owners().release(name)

    def owner_of(self, name: str) -> str | None:
        with self._lock:
            return self._ephemeral.get(name)

    def end_session(self, session: str) -> list[str]:
        """Destroy the ephemeral sandboxes ``session`` created; their names."""
        with self._lock:
            mine = [name for name, owner in self._ephemeral.items() if owner == session]
        ended = []
        for name in mine:
            try:
                opened = self.use(name)
                with opened.lock:
                    opened.recorded.settle()
                    self._destroy(opened)
            except SandboxNotFound:
                self._forget(name)
            except SandboxError:
                continue  # unreachable now: left to gc (its owner record goes when we exit)
            ended.append(name)
        return ended

    def close(self) -> None:
        with self._lock:
            opened = list(self._open.values())
            self._open.clear()
            audit, self._audit = self._audit, None
        for item in opened:
            item.recorded.close()
        if audit is not None:
            audit.close()


def check_path(path: Any, what: str = "path") -> str:
    """An absolute path inside the sandbox, or a tool error saying so."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise InvalidInput(f"{what} must be an absolute path inside the sandbox (starting with /), got {path!r}")
    if "\x00" in path:
        raise InvalidInput(f"{what} must not contain a NUL byte")
    return path
