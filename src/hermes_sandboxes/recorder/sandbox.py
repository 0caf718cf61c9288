"""RecordedSandbox: any backend's Sandbox, with every action journaled and checkpoints that explain
themselves.

It wraps (never subclasses) a ``Sandbox``, so the Sprites and E2B backends get the story, the
automatic checkpoints and the audit log unchanged. What it adds:

- every exec goes to the sandbox's journal and to the audit log, with exit code and duration;
- before a command, the checkpoint policy (``off`` | ``risky`` | ``always``, judged by
  ``risk.wants_checkpoint``) may take an automatic checkpoint. Fail-closed: if that checkpoint
  cannot be taken, the command does not run;
- checkpoints record the writable layer's size and, when configured, a health command's result;
- an automatic checkpoint is reused while the sandbox has not changed since (``autocheckpoint``);
- retention keeps the last N automatic checkpoints (``retention``); a checkpoint named to the agent
  that it did delete is reported in ``broken_promises``;
- ``checkpoints()`` tells each checkpoint's story; ``restore_preview()`` says what a restore would
  throw away (diff summary where the backend can diff, and the commands since the checkpoint).

- ``start()`` / ``exec()`` are the one recorded path of a command for every face: plan the
  per-command credentials, classify, checkpoint if risky (``on_checkpoint`` tells the face, before
  the command starts, which checkpoint protects it), start, and journal how it ended (an
  interrupted, timed-out, memory-killed or killed command included: ``RecordedProcess``);
- ``restore_preview()`` then ``restore(preview)`` are one pass: the journal read once, the
  checkpoints listed once, the diff summarised once;
- where the backend lacks a capability, it degrades and says so: no checkpoint deletion means
  retention keeps everything (``retention_note``), no diff means previews say why.

Commands are written ahead: before a command starts, an ``exec_start`` record (its id, command,
working directory, automatic checkpoint and the recording process's identity) goes to the journal
and the audit log; its end completes it. However the recording process ends (kill -9 included), a
command that started is in the record: readers show one with no end as unfinished while its
recorder lives and as lost once it died, and ``settle()`` (the CLI's next call that reads the
story, or ``gc``) writes its end as lost (``settling``). The write-ahead append follows the
journal's own fsync policy.

What it is told at construction comes as value objects (``options``: ``Checkpointing``,
``Retention``, ``Health``, ``Credentials``, ``Hooks``). It knows no face and no agent framework: a
face passes ``Hooks`` (which commands and files are the framework's own, what to do after a restore
or a destroy).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Collection, Iterator, Sequence

from hermes_sandboxes.errors import CheckpointFailed, CheckpointNotFound, InvalidInput, SandboxError, Unsupported
from hermes_sandboxes.recorder import autocheckpoint, liveness, retention, settling
from hermes_sandboxes.recorder import writeahead as intents
from hermes_sandboxes.recorder.command import Prepared, RecordedProcess
from hermes_sandboxes.recorder.credentials import CredentialPlan, Redactor, plan_credentials
from hermes_sandboxes.recorder.journal import Journal
from hermes_sandboxes.recorder.options import (
    Checkpointing,
    Credentials,
    Health,
    Hooks,
    Retention,
    validate_policy,
)
from hermes_sandboxes.recorder.records import (
    MAX_OUTPUT_TAIL_CHARS,
    AllowRecord,
    CheckpointDeleteRecord,
    CheckpointNamedRecord,
    CheckpointRecord,
    CheckpointStartRecord,
    CreateRecord,
    DestroyRecord,
    ExecRecord,
    ExecStartRecord,
    ForkRecord,
    HealthCheck,
    Intent,
    Record,
    RecordBase,
    RestoreRecord,
    RestoreStartRecord,
    StopRecord,
    command_text,
    validate_trigger,
)
from hermes_sandboxes.recorder.story import CheckpointStory, Story, fold_story
from hermes_sandboxes.risk import RiskVerdict, wants_checkpoint
from hermes_sandboxes.sandbox import (
    Capability,
    Checkpoint,
    Command,
    ExecResult,
    FileChange,
    Process,
    Sandbox,
)
from hermes_sandboxes.util.values import dataclass, field, replace

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the hot path of a CLI exec)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from typing_extensions import Unpack

    from hermes_sandboxes.recorder.command import CommandOptions
    from hermes_sandboxes.recorder.diffsummary import DiffSummary
    from hermes_sandboxes.recorder.records import DeleteReason, Trigger
    from hermes_sandboxes.risk import CheckpointPolicy

UNKNOWN_TRIGGER = "unknown"  # a checkpoint the journal has no record of (taken by other means)


@dataclass(frozen=True)
class StoriedCheckpoint:
    """A checkpoint with its story: why it was taken, from which state, and what ran before it.

    ``to_dict()`` is the documented, flat schema of ``checkpoint list --json`` and the agent tools:
    ``id``, ``created_at``, ``comment``, ``trigger`` (manual | auto | agent | unknown),
    ``trigger_command`` (the risky command an automatic checkpoint protects against),
    ``previous`` (the checkpoint this state grew from), ``commands`` (what ran since ``previous``:
    command, exit_code, duration_s, timed_out, killed, internal, ts, unfinished, lost), ``health`` (the health
    command's result: command, exit_code, passed, output_tail; or null), ``layer_bytes`` (size of
    what the sandbox had changed, where known) and ``journaled`` (false: taken by other means, the
    journal has no story for it)."""

    id: str
    created_at: float
    comment: str = ""
    trigger: str = UNKNOWN_TRIGGER
    trigger_command: str | None = None
    previous: str | None = None
    commands: tuple[ExecRecord, ...] = ()
    health: HealthCheck | None = None
    layer_bytes: int | None = None
    journaled: bool = False

    @property
    def checkpoint(self) -> Checkpoint:
        """The plain checkpoint, as the backend lists it."""
        return Checkpoint(self.id, self.created_at, self.comment, self.layer_bytes)

    def to_dict(self) -> dict[str, Any]:
        """The flat schema described above (JSON-ready)."""
        return {
            "id": self.id, "created_at": self.created_at, "comment": self.comment, "trigger": self.trigger,
            "trigger_command": self.trigger_command, "previous": self.previous,
            "commands": [c.to_summary() for c in self.commands],
            "health": self.health.to_dict() if self.health else None,
            "layer_bytes": self.layer_bytes, "journaled": self.journaled,
        }


@dataclass(frozen=True)
class RecordedExec:
    """A command's result, the automatic checkpoint taken just before it (if any) and why; the
    result's fields read through (``exit_code``, ``stdout``...), as on ``Sandbox.exec``'s."""

    result: ExecResult
    auto_checkpoint: StoriedCheckpoint | None
    verdict: RiskVerdict
    credentials: CredentialPlan = field(default_factory=CredentialPlan)

    @property
    def exit_code(self) -> int:
        return self.result.exit_code

    @property
    def stdout(self) -> str:
        return self.result.stdout

    @property
    def stderr(self) -> str:
        return self.result.stderr

    @property
    def ok(self) -> bool:
        return self.result.ok

    @property
    def timed_out(self) -> bool:
        return self.result.timed_out

    @property
    def duration_s(self) -> float:
        return self.result.duration_s


@dataclass(frozen=True)
class RestorePreview:
    """What restoring ``checkpoint`` would throw away, as ``RecordedSandbox.restore_preview`` found it;
    ``restore()`` takes it as it is (no second listing, journal read or diff)."""

    checkpoint: StoriedCheckpoint
    commands: tuple[ExecRecord, ...] | None  # None: the journal cannot tell
    changes: tuple[FileChange, ...] | None  # None: no diff (see ``diff_unavailable``)
    summary: DiffSummary | None
    diff_unavailable: str | None = None  # why there is no diff
    include_internal: bool = False  # whether ``commands`` and ``changes`` hold the framework's own

    def to_dict(self) -> dict[str, Any]:
        """``checkpoint`` (``StoriedCheckpoint.to_dict``), ``commands``, ``summary``, ``diff_unavailable``."""
        return {
            "checkpoint": self.checkpoint.to_dict(),
            "commands": None if self.commands is None else [c.to_summary() for c in self.commands],
            "summary": self.summary.to_dict() if self.summary else None,
            "diff_unavailable": self.diff_unavailable,
        }


OnCheckpoint = Callable[[StoriedCheckpoint, RiskVerdict, bool], None]


class RecordedSandbox:
    """A Sandbox whose execs, checkpoints, restores and deletions are journaled.

    ``journal`` is this sandbox's own journal; ``audit``, when given, is the log shared by every
    sandbox and receives the same records. The rest comes as value objects (``options``; None: the
    defaults, which mean nothing special): ``checkpointing`` (when to take an automatic
    checkpoint), ``retention`` (how many to keep), ``health`` (what to run before a checkpoint),
    ``credentials`` (per-command secrets), ``hooks`` (what the face teaches it), and ``origin``
    (tags every record carries). InvalidInput for an unknown policy or a retention that keeps
    nothing; Unsupported for a policy other than off on a backend that cannot checkpoint."""

    def __init__(
        self,
        sandbox: Sandbox,
        journal: Journal,
        audit: Journal | None = None,
        *,
        checkpointing: Checkpointing | None = None,
        retention: Retention | None = None,
        health: Health | None = None,
        credentials: Credentials | None = None,
        hooks: Hooks | None = None,
        origin: Mapping[str, str] | None = None,
    ) -> None:
        self._inner = sandbox
        self._journal = journal
        self._audit = audit if audit is not None and audit.path != journal.path else None
        self._markers = intents.Markers(journal.path)
        self.checkpointing = (checkpointing or Checkpointing()).validated()
        self.retention = (retention or Retention()).validated()
        health = health or Health()
        self.health = replace(health, on=frozenset(validate_trigger(t) for t in health.on))
        self.credentials = credentials or Credentials()
        self.redactor = self.credentials.redactor if self.credentials.redactor is not None else Redactor()
        self.hooks = hooks or Hooks()
        self.origin = dict(origin or {})
        self.broken_promises: tuple[str, ...] = ()  # named checkpoints the last pruning deleted
        self.retention_note = ""  # set when retention had to keep more than it was asked to
        self.restore_token = ""  # what ``hooks.on_restored`` returned for the last restore through this object
        self._oom_seen: int | None = None  # the memory limit's kill count as last read (see read_oom_kills)
        if self.policy != "off":
            self._require_checkpoints()

    @property
    def policy(self) -> CheckpointPolicy:
        """The sandbox's checkpoint policy (``checkpointing.policy``)."""
        return self.checkpointing.policy

    @property
    def inner(self) -> Sandbox:
        """The wrapped sandbox, for what needs no record (files, background processes)."""
        return self._inner

    @property
    def name(self) -> str:
        """The sandbox's name."""
        return self._inner.name

    @property
    def journal(self) -> Journal:
        """This sandbox's own journal."""
        return self._journal

    def _record(self, record: RecordBase) -> None:
        self._journal.append(record)
        if self._audit is not None:
            self._audit.append(record)

    def story(self, *, include_internal: bool = False) -> Story:
        """The story folded from the journal now (the framework's own commands left out unless
        ``include_internal``). Reads the journal each time."""
        return self._journal.story(self.name, include_internal=include_internal)

    def _require_checkpoints(self) -> None:
        backend = self._inner.backend
        if Capability.CHECKPOINTS not in backend.capabilities:
            raise Unsupported(
                f"the {backend.name} backend cannot checkpoint sandbox {self.name}; "
                "use checkpoint policy 'off' with it"
            )

    def record_create(self, *, forked_from: str | None = None) -> None:
        """Note that the sandbox was just created (a new life for its name: older stories end)."""
        self._record(CreateRecord(sandbox=self.name, backend=self._inner.backend.name,
                                  ephemeral=self._inner.ephemeral, forked_from=forked_from))

    def record_fork(self, to: str, checkpoint: str | None = None) -> None:
        """Note, in this (the source's) trail, that sandbox ``to`` was forked from it."""
        self._record(ForkRecord(sandbox=self.name, to=to, checkpoint=checkpoint))

    # -- commands -------------------------------------------------------------------------------

    def _prepare(self, command: Command, options: CommandOptions) -> Prepared:
        """Everything before a command starts: its credentials, its automatic checkpoint (told to
        ``on_checkpoint``), its origin, and the record written ahead of it (from then on the journal
        knows it may have run)."""
        self._settle_pending()
        internal = options.get("internal", False)
        record_as = options.get("record_as")
        text = record_as if record_as is not None else command_text(command)
        plan = (plan_credentials(text, self.credentials.programs, self.credentials.lookup) if not internal
                else CredentialPlan())
        for name, value in plan.env.items():
            self.redactor.add(name, value)
        auto, verdict = None, RiskVerdict(False, ())
        if not internal:
            try:
                auto, verdict, fresh = self._checkpoint_if_risky(text, options.get("checkpoint"), options.get("cwd"))
            except (CheckpointFailed, InvalidInput):
                raise
            except SandboxError as exc:  # fail closed: no checkpoint, no risky command
                raise CheckpointFailed(f"the automatic checkpoint of sandbox {self.name} before this command "
                                       f"failed ({exc}); the command was not run") from exc
            on_checkpoint = options.get("on_checkpoint")
            if auto is not None and on_checkpoint is not None:
                on_checkpoint(auto, verdict, fresh)
        tags = {**(options.get("origin") or {})}
        if plan.used:
            tags["credentials"] = ",".join(plan.used)  # names only, never values
        # the framework's housekeeping, by its shape (the classifier's verdict, else the face's hook)
        internal = internal or verdict.internal is not None or self.hooks.internal(text) is not None
        exec_id = os.urandom(8).hex()
        tag = exec_id if Capability.KILL_TAGGED in self._inner.backend.capabilities else None
        start = ExecStartRecord(sandbox=self.name, id=exec_id, command=text, cwd=options.get("cwd"),
                                checkpoint=auto.id if auto is not None else None,
                                origin={**self.origin, **tags}, internal=internal, owner=liveness.current(),
                                tag=tag)
        self._markers.add(exec_id)  # first: a later call finds it if we die (see settle)
        self._record(start)
        return Prepared(text, {**(options.get("env") or {}), **plan.env}, tags, plan, auto, verdict, internal,
                        exec_id, {} if tag is None else {"tag": tag})

    def start(self, command: Command, **options: Unpack[CommandOptions]) -> RecordedProcess:
        """Start ``command`` the recorded way: credentials for the programs it runs, an automatic
        checkpoint first if the policy wants one (told to ``on_checkpoint`` before the command
        starts; if it cannot be taken, nothing runs: CheckpointFailed), a record written ahead that
        it starts, and its end journaled however it ends (see ``RecordedProcess``). See
        ``CommandOptions`` for the options. SandboxError when the sandbox cannot start it (that
        failure is journaled too)."""
        ready = self._prepare(command, options)
        return self._launched(ready, lambda: self._inner.start(
            command, cwd=options.get("cwd"), env=ready.env, stdin=options.get("stdin"),
            on_stdout=options.get("on_stdout"), on_stderr=options.get("on_stderr"), **ready.tagged))

    def attach(self, command: Command, fds: tuple[int, int, int], **options: Unpack[CommandOptions]) -> RecordedProcess:
        """Run ``command`` on the caller's descriptors (an interactive shell on a terminal, see
        ``Sandbox.attach``) the recorded way, as ``start`` does: written ahead, its end journaled
        however it ends. ``stdin``, ``on_stdout`` and ``on_stderr`` do not apply."""
        ready = self._prepare(command, options)
        return self._launched(ready, lambda: self._inner.attach(
            command, fds, cwd=options.get("cwd"), env=ready.env, **ready.tagged))

    def _launched(self, ready: Prepared, launch: Callable[[], Process]) -> RecordedProcess:
        """``launch()``'s process, recorded as ``ready`` describes; a start that fails is journaled."""
        oom_before = self._oom_seen if self._oom_seen is not None else self.read_oom_kills()
        try:
            inner = launch()
        except SandboxError as exc:
            self.record_exec(ready.text, None, 0.0, origin=ready.tags, error=str(exc), internal=ready.internal,
                             exec_id=ready.id)
            raise
        return RecordedProcess(self, inner, ready, oom_before=oom_before)

    def read_oom_kills(self) -> int | None:
        """How many processes the sandbox's memory limit has killed (None: cannot tell), read now
        and kept as the count before the commands that start next. Read by the first command, then
        again only after a command that ends with a failure (which a memory kill, of it or of
        what it started, may be): a command that succeeds reads no cgroup file."""
        try:
            self._oom_seen = self._inner.oom_kills()
        except (SandboxError, OSError):
            self._oom_seen = None
        return self._oom_seen

    def exec(self, command: Command, *, timeout: float | None = None, capture_limit: int = 256 * 1024,
             **options: Unpack[CommandOptions]) -> RecordedExec:
        """Run ``command`` to its end (or ``timeout``) the recorded way (see ``start``). A command
        that an interrupt (Ctrl-C, a signal turned into an exception) stops is killed by the
        sandbox's exec and journaled as killed before the interrupt goes on. Raises what ``start``
        raises."""
        ready = self._prepare(command, options)
        started = time.monotonic()
        ending: dict[str, Any] = {"origin": ready.tags, "internal": ready.internal, "exec_id": ready.id}
        try:
            result = self._inner.exec(command, cwd=options.get("cwd"), env=ready.env, stdin=options.get("stdin"),
                                      timeout=timeout, on_stdout=options.get("on_stdout"),
                                      on_stderr=options.get("on_stderr"), capture_limit=capture_limit,
                                      **ready.tagged)
        except SandboxError as exc:
            self.record_exec(ready.text, None, time.monotonic() - started, error=str(exc), **ending)
            raise
        except BaseException as exc:  # interrupted: exec has killed the command; record before going on
            self.record_exec(ready.text, None, time.monotonic() - started, killed=True,
                             error=f"interrupted ({type(exc).__name__})", **ending)
            raise
        self.record_exec(ready.text, result.exit_code, result.duration_s, timed_out=result.timed_out,
                         killed=result.timed_out, **ending)
        return RecordedExec(result, ready.auto, ready.verdict, ready.plan)

    def settle(self) -> list[Record]:
        """Record the end of what processes that died (kill -9, a crash, a lost host) left open in
        this sandbox's journal (see ``settling``), after the idle stops the sandbox made on its own
        (lost commands may have ended with one). Returns the records written."""
        written = self._journal_idle_stops()
        return written + self._settle(self.story(include_internal=True))

    def _settle(self, story: Story) -> list[Record]:
        return settling.settle(self._inner, story, self._markers, self._record)

    def _settle_pending(self) -> None:
        """Settle first when a process died with a command, restore or checkpoint under way (its
        marker is left): a verdict on a restore or checkpoint must see the sandbox as that process
        left it, and its command must not run on. Without such a marker this costs one ``listdir``.
        An idle stop the sandbox made on its own is journaled here too (before the command that
        starts it again)."""
        if self._markers.dead():
            self.settle()
        else:
            self._journal_idle_stops()

    def _journal_idle_stops(self) -> list[Record]:
        written: list[Record] = [StopRecord(sandbox=self.name, ts=stop.at, reason="idle",
                                            idle_timeout=stop.idle_timeout) for stop in self._inner.take_idle_stops()]
        for record in written:
            self._record(record)
        return written

    @contextlib.contextmanager
    def _ahead(self, intent: Intent) -> Iterator[None]:
        """Write ``intent`` ahead (its marker, then its record) for the block, which records its end.
        If the block raises, its end is judged from the sandbox and recorded before going on."""
        self._markers.add(intent.intent)
        self._record(intent)
        try:
            yield
        except BaseException as exc:
            with contextlib.suppress(SandboxError):  # cannot judge now: a later call will, once we are gone
                journaled = set(self.story(include_internal=True).checkpoints)
                why = f"it failed ({type(exc).__name__}: {exc})"
                self._record(intents.settle(self._inner, intent, journaled, why))
                self._markers.remove(intent.intent)
            raise
        self._markers.remove(intent.intent)

    def checkpoint_if_risky(self, command: str, *, policy: CheckpointPolicy | None = None,
                            cwd: str | None = None) -> tuple[StoriedCheckpoint | None, RiskVerdict]:
        """The automatic checkpoint before ``command``, when the policy (``policy`` overrides the
        sandbox's) wants one: a new one, or the last one when nothing changed since
        (``autocheckpoint``). Raises if it cannot be taken: callers must not run the command then."""
        taken, verdict, _ = self._checkpoint_if_risky(command, policy, cwd)
        return taken, verdict

    def _checkpoint_if_risky(self, command: str, policy: CheckpointPolicy | None,
                             cwd: str | None) -> tuple[StoriedCheckpoint | None, RiskVerdict, bool]:
        """As ``checkpoint_if_risky``, and whether the checkpoint was taken now (False: reused)."""
        chosen = self.policy if policy is None else validate_policy(policy)
        verdict = wants_checkpoint(chosen, command, protected_paths=self.checkpointing.protected_paths,
                                   exists=self._exists, cwd=cwd)
        if not verdict.risky:
            return None, verdict, False
        self.broken_promises = ()
        if (unchanged := self._unchanged_base()) is not None:
            return unchanged, verdict, False
        taken = self.checkpoint(autocheckpoint.comment(command, verdict), trigger="auto", trigger_command=command)
        return taken, verdict, True

    def _unchanged_base(self) -> StoriedCheckpoint | None:
        """The checkpoint the sandbox grew from, if nothing but scratch files changed since."""
        base = self.story().base
        if not autocheckpoint.unchanged_since(self._inner, base, self.hooks.scratch):
            return None
        assert base is not None
        try:
            return self.get_checkpoint(base)
        except SandboxError:  # gone since: a new checkpoint is the safe answer
            return None

    def promise(self, checkpoint_id: str) -> None:
        """Record that ``checkpoint_id`` was named to the agent as the way to undo a command:
        retention keeps the newest such checkpoint whatever its age."""
        self._record(CheckpointNamedRecord(sandbox=self.name, id=checkpoint_id))

    def record_exec(self, command: str, exit_code: int | None, duration_s: float, *, timed_out: bool = False,
                    origin: Mapping[str, str] | None = None, error: str | None = None, killed: bool = False,
                    internal: bool | None = None, exec_id: str | None = None) -> None:
        """Journal (and audit) how a command ended; ``origin`` adds to the sandbox's own tags. Used
        by ``start``/``exec``/``attach`` and by faces that run a command past them.
        ``internal`` marks housekeeping the agent framework sent by itself; None asks
        ``hooks.internal``. ``exec_id`` is the id of the record written ahead of the command, if any."""
        if internal is None:
            internal = self.hooks.internal(command) is not None
        self._record(ExecRecord(sandbox=self.name, command=command, exit_code=exit_code,
                                duration_s=duration_s, timed_out=timed_out,
                                origin={**self.origin, **(origin or {})}, error=error, killed=killed,
                                internal=internal, id=exec_id))
        if exec_id is not None:
            self._markers.remove(exec_id)

    def _exists(self, path: str) -> bool:
        """Whether ``path`` exists in the sandbox; the classifier asks only about redirect targets
        under protected paths. When we cannot tell, say yes: a needless checkpoint is cheap."""
        try:
            return self._inner.exec(["test", "-e", path], timeout=30).exit_code != 1
        except SandboxError:
            return True

    # -- checkpoints ----------------------------------------------------------------------------

    def checkpoint(self, comment: str = "", *, trigger: Trigger = "manual",
                   trigger_command: str | None = None, health: bool | None = None) -> StoriedCheckpoint:
        """Take a checkpoint and record its story. ``health`` forces the health command on or off;
        by default it runs when one is configured and ``trigger`` is in ``health.on``. An automatic
        one prunes older ones (``retention``). Unsupported where the backend cannot checkpoint;
        CheckpointFailed (or the backend's SandboxError) when it could not be taken."""
        trigger = validate_trigger(trigger)
        self._require_checkpoints()
        run_health = self.health.command is not None and (
            trigger in self.health.on if health is None else health)
        checked = self._run_health() if run_health else None
        self._settle_pending()
        ahead = CheckpointStartRecord(sandbox=self.name, intent=intents.token(), comment=comment, trigger=trigger,
                                      trigger_command=trigger_command, owner=liveness.current())
        with self._ahead(ahead):
            taken = self._inner.checkpoint(comment)
            # the size the backend reports with the checkpoint (None when it measures lazily, as the
            # local backend does: walking a big layer here would cost more than the snapshot)
            self._record(CheckpointRecord(sandbox=self.name, id=taken.id, comment=comment, trigger=trigger,
                                          trigger_command=trigger_command, layer_bytes=taken.size_bytes,
                                          health=checked, intent=ahead.intent))
        if trigger == "auto":
            pruned = retention.prune(self._inner, self.story(), self.retention, self._record)
            self.broken_promises, self.retention_note = pruned.broken_promises, pruned.note or self.retention_note
        return self._enrich(taken, self.story(), live=None)

    def _run_health(self) -> HealthCheck:
        command = self.health.command
        assert command is not None
        text = command_text(command)
        try:
            result = self._inner.exec(command, timeout=self.health.timeout,
                                      capture_limit=4 * MAX_OUTPUT_TAIL_CHARS)
        except SandboxError as exc:  # a broken health check must not cost the user the checkpoint
            return HealthCheck(text, None, False, str(exc))
        output = (result.stdout + result.stderr)[-MAX_OUTPUT_TAIL_CHARS:]
        return HealthCheck(text, result.exit_code, result.ok and not result.timed_out, output)

    def checkpoints(self, *, include_internal: bool = False) -> list[StoriedCheckpoint]:
        """The sandbox's checkpoints, oldest first, each with its story (the agent framework's own
        housekeeping commands left out unless ``include_internal``, which also lists the checkpoints a
        service made by itself). SandboxError when the backend cannot list them."""
        listed = self._listed(include_internal)
        story, live = self.story(include_internal=include_internal), {c.id for c in listed}
        return [self._enrich(c, story, live) for c in listed]

    def get_checkpoint(self, checkpoint_id: str, *, include_internal: bool = False) -> StoriedCheckpoint:
        """One checkpoint with its story (see ``checkpoints``); CheckpointNotFound when the sandbox
        has none by that id."""
        return self._find(checkpoint_id, self._listed(include_internal), self.story(include_internal=include_internal))

    def _listed(self, include_internal: bool) -> list[Checkpoint]:
        """The backend's checkpoints; with ``include_internal`` also those a service made by itself."""
        return self._inner.all_checkpoints() if include_internal else self._inner.checkpoints()

    def _find(self, checkpoint_id: str, listed: Sequence[Checkpoint], story: Story) -> StoriedCheckpoint:
        live = {c.id for c in listed}
        for checkpoint in listed:
            if checkpoint.id == checkpoint_id:
                return self._enrich(checkpoint, story, live)
        raise CheckpointNotFound(f"sandbox {self.name} has no checkpoint {checkpoint_id!r}", sandbox=self.name)

    def _enrich(self, checkpoint: Checkpoint, story: Story, live: Collection[str] | None) -> StoriedCheckpoint:
        """``checkpoint`` with its story; ``live`` (the ids that still exist) lets the story skip over
        deleted checkpoints, None takes it as recorded."""
        told = story.get(checkpoint.id)
        if told is None:
            return StoriedCheckpoint(checkpoint.id, checkpoint.created_at, checkpoint.comment,
                                     layer_bytes=checkpoint.size_bytes)
        previous, commands = (told.previous, list(told.commands)) if live is None else (
            _since_listed(told, story, live))
        record = told.record
        return StoriedCheckpoint(
            id=checkpoint.id, created_at=checkpoint.created_at, comment=checkpoint.comment or record.comment,
            trigger=record.trigger, trigger_command=record.trigger_command, previous=previous,
            commands=tuple(commands), health=record.health,
            layer_bytes=checkpoint.size_bytes if checkpoint.size_bytes is not None else record.layer_bytes,
            journaled=True)

    # -- network ------------------------------------------------------------------------------

    def set_allow(self, allow: Sequence[str], *, previous: Sequence[str] | None = None) -> tuple[str, ...]:
        """Replace the sandbox's egress allow-list (``Sandbox.set_allow``) and record the change in
        its journal and the audit log; returns the list as set. ``previous``, the list before, is
        what the record compares with (None: not known). InvalidInput for an entry that does not
        parse; Unsupported where the backend has no allow-list."""
        from hermes_sandboxes.allowlist import validate  # only when a list changes

        entries = validate(allow)
        self._inner.set_allow(entries)
        self._record(AllowRecord(sandbox=self.name, allow=entries,
                                 previous=None if previous is None else tuple(previous)))
        return entries

    def change_allow(self, *, replace: Sequence[str] | None = None, add: Sequence[str] = (),
                     remove: Sequence[str] = ()) -> tuple[str, ...]:
        """The egress allow-list replaced by ``replace``, or the current one with ``add`` and without
        ``remove`` (``allowlist.edited``), set and recorded as ``set_allow`` does; returns the new list.
        Unsupported where the backend has no allow-list, InvalidInput for a sandbox whose network is
        not "proxy" (chosen at creation) or an entry to remove that the list does not hold.

        The read, the change and the record happen under the sandbox's allow-list lock
        (``allow_lock``), which every face takes (CLI, Hermes command, this API): two changes made
        at once on this host both land, one after the other."""
        from hermes_sandboxes.allowlist import edited  # only when a list changes

        backend = self._inner.backend
        if Capability.EGRESS_ALLOWLIST not in backend.capabilities:
            raise Unsupported(f"the {backend.name} backend has no egress allow-list to change (network 'proxy')")
        with self.allow_lock():
            spec = self._inner.info().spec
            if spec.network != "proxy":
                raise InvalidInput(f"sandbox {self.name} has network {spec.network!r}; an allow-list only applies "
                                   "to network 'proxy', which is chosen when a sandbox is created")
            try:
                entries = list(replace) if replace is not None else edited(spec.allow, add=add, remove=remove)
            except InvalidInput as exc:
                raise InvalidInput(f"sandbox {self.name}: {exc}") from None
            return self.set_allow(entries, previous=spec.allow)

    def allow_lock(self) -> contextlib.AbstractContextManager[None]:
        """The cross-process lock of this sandbox's egress allow-list (a file beside its journal):
        hold it around any read-modify-write of the list. SandboxError when another process holds
        it for a minute."""
        from hermes_sandboxes.util.flock import exclusive

        path = self._journal.path
        return exclusive(path.with_name(path.name + ".allow.lock"),
                         what=f"changing the allow-list of sandbox {self.name}")

    # -- restore, delete, destroy ---------------------------------------------------------------

    def restore_preview(self, checkpoint_id: str, *, diff: bool = True, include_internal: bool = False,
                        settle: bool = False) -> RestorePreview:
        """What restoring ``checkpoint_id`` would throw away; changes nothing in the sandbox. The
        agent framework's housekeeping (its commands and scratch files) is left out unless
        ``include_internal``. With ``settle``, what dead processes left open is settled first (see
        ``settle``), from the same reading of the journal. ``diff=False`` leaves the diff for
        ``with_diff``. One listing of the checkpoints, one reading of the journal, one diff.
        CheckpointNotFound for an unknown id."""
        if settle:
            self._journal_idle_stops()  # first, as ``settle`` does (written before the journal is read)
        records = self._journal.records(sandbox=self.name)
        if settle:
            records += self._settle(fold_story(records, include_internal=True))
        story = fold_story(records, include_internal=include_internal)
        checkpoint = self._find(checkpoint_id, self._listed(include_internal), story)
        since = story.commands_since(checkpoint_id, created_at=checkpoint.created_at)
        preview = RestorePreview(checkpoint, None if since is None else tuple(since), None, None, "not asked for",
                                 include_internal=include_internal)
        return self.with_diff(preview) if diff else preview

    def with_diff(self, preview: RestorePreview) -> RestorePreview:
        """``preview`` with the file changes since its checkpoint and their summary (or why there are
        none: a backend that cannot diff)."""
        backend = self._inner.backend
        if Capability.DIFF not in backend.capabilities:
            return replace(preview, diff_unavailable=f"the {backend.name} backend cannot diff checkpoints")
        try:
            changes = tuple(c for c in self._inner.diff(preview.checkpoint.id)
                            if preview.include_internal or not self.hooks.scratch(c.path))
        except Unsupported as exc:
            return replace(preview, diff_unavailable=str(exc))
        from hermes_sandboxes.recorder.diffsummary import summarize  # previews only: off the hot path of exec

        return replace(preview, changes=changes, summary=summarize(changes), diff_unavailable=None)

    def restore(self, checkpoint: str | RestorePreview, *, include_internal: bool = False) -> list[ExecRecord] | None:
        """Restore to ``checkpoint`` (an id, or the preview of it, whose findings are used as they
        are) and record it, taking no diff of its own (an undo never waits on one: a tree made to be
        slow to compare must not hold it back); returns the commands thrown away (None: the journal
        cannot tell), the agent framework's own housekeeping left out unless ``include_internal``.
        ``hooks.on_restored`` runs afterwards, also when the restore failed. CheckpointNotFound for an unknown id; the
        backend's SandboxError when the restore failed."""
        self._settle_pending()
        if isinstance(checkpoint, str) or checkpoint.include_internal != include_internal:
            checkpoint = self.restore_preview(checkpoint if isinstance(checkpoint, str) else checkpoint.checkpoint.id,
                                              diff=False, include_internal=include_internal)
        checkpoint_id = checkpoint.checkpoint.id
        discarded = None if checkpoint.commands is None else list(checkpoint.commands)
        ahead = RestoreStartRecord(sandbox=self.name, id=checkpoint_id, intent=intents.token(),
                                   discarded=len(discarded or ()), owner=liveness.current())
        try:
            with self._ahead(ahead):  # recorded as restored exactly when the files are the checkpoint's
                self._inner.restore(checkpoint_id)
                self._record(RestoreRecord(sandbox=self.name, id=checkpoint_id, discarded=ahead.discarded,
                                           intent=ahead.intent))
        except BaseException:
            with contextlib.suppress(Exception):  # a failed restore may have changed files all the same
                self._restored()
            raise
        self._restored()
        return discarded

    def _restored(self) -> None:
        if self.hooks.on_restored is not None:
            self.restore_token = self.hooks.on_restored(self)

    def delete_checkpoint(self, checkpoint_id: str, *, reason: DeleteReason = "manual") -> None:
        """Delete a checkpoint and record why. CheckpointNotFound for an unknown id; Unsupported
        where the backend cannot delete checkpoints."""
        self._inner.delete_checkpoint(checkpoint_id)
        self._record(CheckpointDeleteRecord(sandbox=self.name, id=checkpoint_id, reason=reason))

    def destroy(self) -> None:
        """Destroy the sandbox and record it; ``hooks.on_destroyed`` runs afterwards. The backend's
        SandboxError when it could not be destroyed (nothing is recorded then)."""
        self._inner.destroy()
        self._record(DestroyRecord(sandbox=self.name))
        self._markers.clear()  # nothing runs in it any more: nothing to stop
        if self.hooks.on_destroyed is not None:
            self.hooks.on_destroyed(self)

    def close(self) -> None:
        """Close the journal (the audit log may be shared: its owner closes it)."""
        self._journal.close()


def _since_listed(
    told: CheckpointStory, story: Story, live: Collection[str]
) -> tuple[str | None, list[ExecRecord]]:
    """The previous checkpoint that still exists and the commands since it: when retention has
    deleted the one in between, its commands belong to this checkpoint's story."""
    previous, commands = told.previous, list(told.commands)
    seen = {told.record.id}
    while previous is not None and previous not in live and previous not in seen:
        before = story.get(previous)
        if before is None:
            break
        seen.add(previous)
        previous, commands = before.previous, [*before.commands, *commands]
    return previous, commands
