"""The Hermes ``BaseEnvironment`` over any backend's ``Sandbox``: where Hermes's commands actually run.

Hermes keeps the shell semantics (login snapshot, cwd markers, its deadline and interrupt); we supply
``_run_bash``, which starts ``bash -c <Hermes's wrapper>`` in the sandbox through the recorder's one
recorded path (per-command credentials, the automatic checkpoint before a risky command, the journal)
and returns a streaming handle whose ``kill()`` kills the command's process tree there. Around it we
add redaction, file sync that refuses to run against stale state, and the audit origin. Shell
invocations Hermes makes outside ``execute()`` (its session snapshot) are journaled as internal.

Hermes calls ``cleanup()`` after every turn unless ``_persistent`` is true, and also from its idle
reaper and at exit. Here ``_persistent`` mirrors ``terminal.container_persistent``. What cleanup does
(the rules of when it runs are in teardown.py):

=========================================  ====================================  ==============================
trigger                                    persistent                            ephemeral
=========================================  ====================================  ==============================
cleanup (turn end, idle reaper, exit)      pull agent-authored files back (the   pull back, then destroy the
                                           backend resumes a paused sandbox      run-unique sandbox
                                           first), release the writer lease;
                                           the sandbox is never paused or
                                           killed by us
cleanup while a command runs               deferred until it ends                deferred until it ends
an environment finalised without cleanup   release the lease, never pull         destroy the sandbox, never pull
cleanup again                              nothing                               nothing
the sandbox is already gone                nothing to pull, no error             nothing to pull, no error
=========================================  ====================================  ==============================
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tools.environments.base import BaseEnvironment, EnvironmentConnectionError

from hermes_sandboxes.errors import CheckpointFailed, SandboxError, SandboxNotFound
from hermes_sandboxes.hermes import conversation
from hermes_sandboxes.hermes.handle import StreamingHandle
from hermes_sandboxes.hermes.sync import restores
from hermes_sandboxes.hermes.sync.filesync import Pulled, SandboxFileSync, SyncFailed
from hermes_sandboxes.hermes.sync.leases import NotAdmitted, WriterLease
from hermes_sandboxes.hermes.sync.teardown import CommandGate, GateClosed, Step, run_steps
from hermes_sandboxes.recorder.command import RecordedProcess
from hermes_sandboxes.recorder.credentials import CredentialPlan, Redactor
from hermes_sandboxes.recorder.sandbox import RecordedSandbox, StoriedCheckpoint
from hermes_sandboxes.risk import RiskVerdict
from hermes_sandboxes.sandbox import Capability, Process, Sandbox

logger = logging.getLogger(__name__)


@dataclass
class _Call:
    """What one ``execute()`` call hands to the ``_run_bash`` call it makes (on another thread),
    and what that call reports back (the automatic checkpoint, the credentials)."""

    command: str
    origin: Mapping[str, str] = field(default_factory=dict)
    checkpoint: StoriedCheckpoint | None = None
    verdict: RiskVerdict | None = None
    plan: CredentialPlan = field(default_factory=CredentialPlan)


_CALL: contextvars.ContextVar[_Call | None] = contextvars.ContextVar("hermes_sandboxes_call", default=None)


@dataclass(frozen=True)
class EnvironmentOptions:
    """Everything the provider decides before an environment exists."""

    task_key: str
    persistent: bool
    credentials: Mapping[str, str]  # program -> secret name (the recorder injects them)
    sync_lock: threading.Lock
    redactor: Redactor  # also the journals' redactor: a value injected here never reaches their disk
    reopen: Callable[[], RecordedSandbox] | None  # persistent: resume the sandbox if it vanished
    lease: WriterLease | None = None  # remote backends: only the scope's writer syncs state
    recover: bool = False  # remote backends: recovery on resume before the first push (see sync.py)
    # what the session must be told with its next command's output, once (e.g. hermes/allowlist.py's notes)
    notices: list[str] = field(default_factory=list)


class SandboxEnvironment(BaseEnvironment):  # type: ignore[misc]
    """One Hermes task's view of one sandbox."""

    _stdin_mode = "pipe"

    def __init__(
        self, recorded: RecordedSandbox, *, cwd: str, timeout: int, options: EnvironmentOptions,
    ) -> None:
        super().__init__(cwd=cwd, timeout=timeout)
        self._start_cwd = cwd
        self.recorded = recorded
        self.options = options
        self._persistent = options.persistent
        self._redactor = options.redactor  # every value ever injected: a copy in a file stays hidden too
        self._gate = CommandGate(self._teardown, recorded.name)
        self._sync = SandboxFileSync(lambda: self.sandbox, f"{recorded.inner.home}/.hermes", options.sync_lock)
        # a resumed sandbox may hold agent files no teardown pulled back: recover them before pushing
        self._recover_pending = options.recover and not recorded.inner.created
        self._fresh = recorded.inner.created  # holds nothing of ours yet: no listing before the first push
        self._restore_seen: str | None = None  # the scope's restore token at this writer's last sync
        self._own_restore = ""  # the token of this environment's own last restore
        try:
            self._admit(force=True)
        except BaseException:
            self._gate.finalise()  # the caller cleans up what it made; the finaliser has nothing to do
            if options.lease is not None:
                options.lease.release()
            raise
        self.init_session()
        conversation.track(self)  # what a /sandbox typed in this conversation acts on

    @property
    def sandbox(self) -> Sandbox:
        """The backend's sandbox: commands stream through it, the recorder journals them."""
        return self.recorded.inner

    @property
    def closed(self) -> bool:
        """Cleaned up: no command runs here any more."""
        return self._gate.closed

    @property
    def sandbox_name(self) -> str:
        return self.recorded.name

    def get_temp_dir(self) -> str:
        return "/tmp"

    # --- per command -------------------------------------------------------------------------
    def busy(self) -> contextlib.AbstractContextManager[None]:
        """Hold off cleanup while an agent tool works on the sandbox (GateClosed after cleanup)."""
        return self._gate.command()

    def execute(self, command: str, cwd: str = "", **kwargs: Any) -> dict[str, Any]:
        try:
            with self._gate.command():
                return self._execute(command, cwd, **kwargs)
        except GateClosed as exc:
            raise EnvironmentConnectionError(str(exc)) from exc

    def _execute(self, command: str, cwd: str, **kwargs: Any) -> dict[str, Any]:
        if cwd in ("/root", "~") and self.sandbox.home != "/root":
            cwd = self._start_cwd  # Hermes's container default; this sandbox's home is elsewhere
        call = _Call(command=command, origin=self._origin())
        token = _CALL.set(call)
        try:
            result: dict[str, Any] = super().execute(command, cwd, **kwargs)
        except CheckpointFailed as exc:  # fail closed: no checkpoint, no risky command
            return {"output": f"[sandbox: {exc}]", "returncode": 1}
        finally:
            _CALL.reset(token)
        output = self._redactor.redact(str(result.get("output") or ""))
        extra = "\n".join(n for n in (self._checkpoint_note(call), call.plan.note(), self._timeout_note(result),
                                       *self._take_notices()) if n)
        result["output"] = f"{output.rstrip()}\n{extra}".lstrip("\n") if extra else output
        return result

    def _take_notices(self) -> list[str]:
        """What the provider said the session must hear (once), as notes on this command's output."""
        notices = self.options.notices
        taken = [f"[sandbox: {n}]" for n in notices]
        del notices[:len(taken)]
        return taken

    def _timeout_note(self, result: Mapping[str, Any]) -> str:
        """After a deadline, what may still run: nothing where the backend kills whole trees."""
        if not result.get("hermes_timed_out") or Capability.TREE_KILL in self.sandbox.backend.capabilities:
            return ""
        return ("[sandbox: the command was killed at its deadline; processes it started in the background "
                "may still be running (this backend cannot kill a whole process tree)]")

    def _checkpoint_note(self, call: _Call) -> str:
        """What the model is told about the automatic checkpoint taken before its command; retention
        keeps the checkpoint it names (and the note says so when it dropped an older one)."""
        cp, verdict = call.checkpoint, call.verdict
        if cp is None or verdict is None:
            return ""
        self.recorded.promise(cp.id)
        why = f" ({', '.join(verdict.reasons)})" if verdict.reasons else ""
        note = (f"[sandbox: checkpoint {cp.id} was taken before this command{why}; "
                f"to undo the command, call sandbox_restore with id {cp.id}]")
        for lost in self.recorded.broken_promises:
            note += (f"\n[sandbox: checkpoint {lost}, named to you earlier, was deleted by checkpoint "
                     "retention and can no longer be restored]")
        return note

    def _origin(self) -> dict[str, str]:
        origin = {"task": self.options.task_key, "via": "hermes"}
        session = _session_key()
        if session:
            origin["session"] = session
        return origin

    def _before_execute(self) -> None:
        self._admit(force=False)

    def _admit(self, *, force: bool) -> None:
        """Bring the sandbox's state up to date before a command, or refuse to run it.

        Without a lease (the local backend) this process pushes. With one, the scope's writer pushes:
        a writer new to the sandbox (first attach, or a reader taking over from a writer that may have
        died before its teardown pull) first recovers the agent's files, then pushes everything, and
        after a checkpoint restore by any process it pushes what differs. Until such a push completes,
        and after any failed one, the scope is dirty. A reader runs only against prepared, clean
        state (see hermes/sync/leases.py)."""
        lease = self.options.lease
        if lease is None:
            self._push(force=self._follow_local_restore() or force)
            return
        took_over = not lease.is_writer and lease.try_acquire()
        if not lease.is_writer:
            try:
                lease.admit()
            except NotAdmitted as exc:
                raise EnvironmentConnectionError(str(exc)) from exc
            return
        if took_over:
            self._recover_pending = self._recover_pending or self.options.recover
        token = lease.restore_token()
        restored = self._restore_seen is not None and token != self._restore_seen
        if restored:
            self._follow_restore(token)
        force = force or took_over or restored or self._recover_pending
        if force:  # until this push completes, the sandbox does not hold this scope's state
            lease.begin_prepare()
        try:
            self._bring_up_to_date(force=force)
        except EnvironmentConnectionError:
            lease.mark_dirty()
            raise
        self._restore_seen = token
        lease.mark_clean()
        lease.mark_prepared()

    def _follow_local_restore(self) -> bool:
        """Without a lease: whether the sandbox was restored (by anyone) since this environment's
        last push; then what was sent is void and the push must bring everything up to date (only
        what differs is sent)."""
        token = restores.noted(self.recorded.journal.path)  # written by whoever restored (CLI, API, another session)
        restored = self._restore_seen is not None and token != self._restore_seen
        self._restore_seen = token
        if restored:
            self._sync.reset()
            self._sync.learn_remote()
        return restored

    def _follow_restore(self, token: str) -> None:
        """Another process restored the sandbox: what this writer sent is void (the sandbox's
        ~/.hermes is a checkpoint's), and a backend whose restore replaces the sandbox (E2B) has a
        new one under the same name, so find it again by name."""
        self._sync.reset()
        if token != self._own_restore and self.options.reopen is not None:
            self.recorded = self.options.reopen()
            self._fresh = self.recorded.inner.created

    def _bring_up_to_date(self, *, force: bool) -> None:
        """Recovery (when pending), then the push; a full push into a sandbox that already holds our
        files sends only what differs."""
        if self._recover_pending:
            try:
                self._sync.recover()
            except SandboxError as exc:
                raise EnvironmentConnectionError(
                    f"sandbox {self.sandbox_name}: recovery on resume failed, so the host's state was not "
                    f"pushed over the sandbox's: {exc}") from exc
            self._recover_pending = False
        if force and not self._fresh:
            self._sync.learn_remote()
        self._push(force=force)
        self._fresh = False

    def _push(self, *, force: bool) -> None:
        try:
            self._sync.push(force=force)
        except SyncFailed as exc:
            raise EnvironmentConnectionError(str(exc)) from exc

    def _snapshot_excluded_passthrough_names(self) -> tuple[str, ...]:
        # Names listed here are saved around Hermes's snapshot `source` and left out of its
        # `export -p` dump, so an injected credential never lands in the snapshot file on disk.
        names = set(super()._snapshot_excluded_passthrough_names())
        names.update(self.options.credentials.values())
        return tuple(sorted(names))

    def _run_bash(
        self, cmd_string: str, *, login: bool = False, timeout: int = 120, stdin_data: str | None = None,
    ) -> StreamingHandle:
        call = _CALL.get()
        argv = ["bash", "-l", "-c", cmd_string] if login else ["bash", "-c", cmd_string]
        stdin = stdin_data.encode("utf-8", "surrogateescape") if stdin_data is not None else None

        def start(sink: Callable[[bytes], None]) -> Process:
            proc = self._start(argv, stdin=stdin, sink=sink, call=call, timeout=timeout)
            if call is not None:
                call.checkpoint, call.verdict, call.plan = proc.auto_checkpoint, proc.verdict, proc.credentials
            return proc

        return StreamingHandle(start, self._redactor if self._redactor else None)

    def _start(self, argv: list[str], *, stdin: bytes | None, sink: Callable[[bytes], None],
               call: _Call | None, timeout: float) -> RecordedProcess:
        def launch() -> RecordedProcess:
            self.sandbox.reserve(timeout)  # Hermes's deadline: a leased sandbox must outlive it
            if call is None:  # Hermes's own shell work (its session snapshot), not the agent's command
                return self.recorded.start(argv, internal=True, record_as=argv[-1], stdin=stdin,
                                           on_stdout=sink, on_stderr=sink)
            return self.recorded.start(argv, record_as=call.command, origin=call.origin, stdin=stdin,
                                       on_stdout=sink, on_stderr=sink)

        try:
            return launch()
        except SandboxNotFound:
            if self.options.reopen is None:
                raise
        # The persistent sandbox was destroyed behind our back (CLI, another host process): resume a
        # fresh one under the same name and tell the model its files and processes are gone.
        logger.warning("sandbox %s vanished; creating it again", self.sandbox_name)
        self.recorded = self.options.reopen()
        self._sync.reset()
        self._fresh = self.recorded.inner.created
        self._recover_pending = self.options.recover and not self._fresh
        self._admit(force=True)
        self._mark_recreated()
        return launch()

    def _kill_process(self, proc: Any) -> None:
        proc.kill()

    # --- after a restore ------------------------------------------------------------------------
    def after_restore(self) -> None:
        """The filesystem went back in time, ~/.hermes with it: bring it up to date (only what
        differs) and take a fresh shell snapshot. Under a lease the restore is noted for the scope:
        its writer, this process or another, re-syncs before its next command, and until then
        readers are refused (the state is known to be stale)."""
        self._sync.reset()
        lease = self.options.lease
        if lease is None:
            self._restore_seen = None  # this one is followed here: the next _admit must not again
            self._sync.learn_remote()
            self._admit(force=True)
        else:
            # the recorder's on_restored hook noted it already (restores.hooks); one built without it did not
            self._own_restore = self.recorded.restore_token or lease.note_restored()
            if lease.is_writer:
                self._admit(force=False)
        self.init_session()

    # --- teardown -------------------------------------------------------------------------------
    def cleanup(self) -> None:
        gate = getattr(self, "_gate", None)  # None: __init__ failed before it existed
        if gate is not None:
            gate.close()

    def wait_for_cleanup(self, timeout: float | None = None) -> bool:
        """Hermes calls this at exit: a cleanup deferred behind a running command finishes first."""
        return self._gate.wait(timeout)

    def _teardown(self) -> None:
        lease = self.options.lease
        steps: list[Step] = []
        if lease is None or lease.is_writer:
            steps.append(("pull agent-authored files back", self._pull_back))
        else:
            logger.debug("sandbox %s: not the writer, so no pull-back", self.sandbox_name)
        if lease is not None:
            steps.append(("release the writer lease", lease.release))
        if not self._persistent:
            steps.append(("destroy the ephemeral sandbox", self._destroy))
        run_steps(steps, self.sandbox_name)

    def _pull_back(self) -> None:
        pulled = self._sync.pull()
        if pulled is Pulled.GONE:
            logger.info("sandbox %s is already gone: nothing to pull back", self.sandbox_name)
        elif pulled is Pulled.FAILED:
            logger.error("sandbox %s: agent-authored files were not pulled back", self.sandbox_name)

    def _destroy(self) -> None:
        try:
            self.recorded.destroy()
        except SandboxNotFound:
            logger.info("sandbox %s is already gone", self.sandbox_name)

    def __del__(self) -> None:
        """Finalised without a cleanup: never pull (that needs the network and a live profile at an
        unknown moment); release the lease here, and destroy an ephemeral sandbox, which nobody
        could find again."""
        gate = getattr(self, "_gate", None)
        if gate is None or not gate.finalise():
            return
        with contextlib.suppress(Exception):
            if self.options.lease is not None:
                self.options.lease.release()
        if not self._persistent:
            with contextlib.suppress(Exception):
                self.recorded.destroy()


def _session_key() -> str:
    """The session a command runs for: the gateway's session key (a chat platform's), else the
    session id ``hermes chat`` and the other local front ends bind (they set no key)."""
    try:
        from gateway.session_context import get_session_env
    except ImportError:
        return ""
    return str(get_session_env("HERMES_SESSION_KEY", "") or get_session_env("HERMES_SESSION_ID", "") or "")
