"""RecordedSandbox: any backend's Sandbox, with every action journaled and checkpoints that explain
themselves.

It wraps (never subclasses) a ``Sandbox``, so the Sprites and E2B backends get the story, the
automatic checkpoints and the audit log unchanged. What it adds:

- every exec goes to the sandbox's journal and to the audit log, with exit code and duration;
- before a command, the checkpoint policy (``off`` | ``risky`` | ``always``, judged by
  ``risk.wants_checkpoint``) may take an automatic checkpoint. Fail-closed: if that checkpoint
  cannot be taken, the command does not run;
- checkpoints record the writable layer's size and, when configured, a health command's result;
- an automatic checkpoint is not taken again when the sandbox has not changed since the checkpoint
  it grew from (``Sandbox.changed_since`` answers False, or True but the diff holds only the agent
  framework's scratch files): that one is reused, so a stream of commands that change nothing adds
  no checkpoints. None (cannot tell) takes a new one;
- retention keeps the last N automatic checkpoints and never deletes manual or agent ones, any
  checkpoint younger than ``min_age`` seconds, nor the newest checkpoint named to the agent as its
  undo (``promise``). A named checkpoint it did delete is reported in ``broken_promises``;
- ``checkpoints()`` tells each checkpoint's story; ``restore_preview()`` says what a restore would
  throw away (diff summary where the backend can diff, and the commands since the checkpoint).

- ``start()`` / ``exec()`` are the one recorded path of a command for every face: plan the
  per-command credentials, classify, checkpoint if risky, start, and journal how it ended (an
  interrupted or killed command included);
- where the backend lacks a capability, it degrades and says so: no checkpoint deletion means
  retention keeps everything (``retention_note``), no diff means previews say why.

Commands are written ahead: before a command starts, an ``exec_start`` record (its id, command,
working directory, automatic checkpoint and the recording process's identity) goes to the journal
and the audit log; its end completes it. However the recording process ends (kill -9 included), a
command that started is in the record: readers show one with no end as unfinished while its
recorder lives and as lost once it died, and ``settle()`` (the CLI's next call that reads the
story, or ``gc``) writes its end as lost. The write-ahead append follows the journal's own fsync
policy.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path

from hermes_sandboxes.errors import CheckpointFailed, CheckpointNotFound, InvalidInput, SandboxError, Unsupported
from hermes_sandboxes.recorder import liveness, lost
from hermes_sandboxes.recorder import writeahead as intents
from hermes_sandboxes.recorder.command import RecordedProcess, _Prepared
from hermes_sandboxes.recorder.credentials import CredentialPlan, Redactor, SecretLookup, plan_credentials
from hermes_sandboxes.recorder.journal import Journal
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
from hermes_sandboxes.recorder.story import CheckpointStory, Story
from hermes_sandboxes.risk import CHECKPOINT_POLICIES, RiskVerdict, hermes_internal, wants_checkpoint
from hermes_sandboxes.risk.internal import is_hermes_scratch
from hermes_sandboxes.sandbox import (
    Capability,
    Checkpoint,
    Command,
    ExecResult,
    FileChange,
    Process,
    Sandbox,
)
from hermes_sandboxes.util.values import dataclass, field

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the hot path of a CLI exec)
if TYPE_CHECKING:
    from typing import Any

    from typing_extensions import Unpack

    from hermes_sandboxes.hermes.sync.leases import WriterLease
    from hermes_sandboxes.recorder.command import CommandOptions
    from hermes_sandboxes.recorder.diffsummary import DiffSummary
    from hermes_sandboxes.recorder.records import (
        DeleteReason,
        Trigger,
    )
    from hermes_sandboxes.risk import CheckpointPolicy

DEFAULT_RETENTION = 10
DEFAULT_MIN_AGE = 600.0  # seconds: an automatic checkpoint this young is never pruned
UNKNOWN_TRIGGER = "unknown"  # a checkpoint the journal has no record of (taken by other means)


def _no_secret(name: str) -> str | None:
    return None


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
        return Checkpoint(self.id, self.created_at, self.comment, self.layer_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "created_at": self.created_at, "comment": self.comment, "trigger": self.trigger,
            "trigger_command": self.trigger_command, "previous": self.previous,
            "commands": [c.to_summary() for c in self.commands],
            "health": self.health.to_dict() if self.health else None,
            "layer_bytes": self.layer_bytes, "journaled": self.journaled,
        }


@dataclass(frozen=True)
class RecordedExec:
    """A command's result, the automatic checkpoint taken just before it (if any) and why."""

    result: ExecResult
    auto_checkpoint: StoriedCheckpoint | None
    verdict: RiskVerdict
    credentials: CredentialPlan = field(default_factory=CredentialPlan)


@dataclass(frozen=True)
class RestorePreview:
    """What restoring ``checkpoint`` would throw away."""

    checkpoint: StoriedCheckpoint
    commands: tuple[ExecRecord, ...] | None  # None: the journal cannot tell
    changes: tuple[FileChange, ...] | None  # None: no diff (see ``diff_unavailable``)
    summary: DiffSummary | None
    diff_unavailable: str | None = None  # why there is no diff

    def to_dict(self) -> dict[str, Any]:
        return {
            "checkpoint": self.checkpoint.to_dict(),
            "commands": None if self.commands is None else [c.to_summary() for c in self.commands],
            "summary": self.summary.to_dict() if self.summary else None,
            "diff_unavailable": self.diff_unavailable,
        }


def _validate_policy(policy: str) -> CheckpointPolicy:
    if policy not in CHECKPOINT_POLICIES:
        raise InvalidInput(
            f"unknown checkpoint policy {policy!r}: use one of {', '.join(CHECKPOINT_POLICIES)}")
    return policy


def _short(command: str, limit: int = 80) -> str:
    line = " ".join(command.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


class RecordedSandbox:
    """A Sandbox whose execs, checkpoints, restores and deletions are journaled.

    ``journal`` is this sandbox's own journal; ``audit``, when given, is the log shared by every
    sandbox and receives the same records. ``health_command`` runs inside the sandbox before the
    checkpoints whose trigger is in ``health_on`` (by default not before automatic ones, which
    would run the test suite before every risky command)."""

    def __init__(
        self,
        sandbox: Sandbox,
        journal: Journal,
        audit: Journal | None = None,
        *,
        policy: CheckpointPolicy = "off",
        retention: int = DEFAULT_RETENTION,
        min_age: float = DEFAULT_MIN_AGE,
        retention_bytes: int | None = None,
        protected_paths: Sequence[str] = (),
        health_command: Command | None = None,
        health_timeout: float | None = 600.0,
        health_on: Collection[Trigger] = ("manual", "agent"),
        origin: Mapping[str, str] | None = None,
        credentials: Mapping[str, str] | None = None,
        lookup: SecretLookup = _no_secret,
        redactor: Redactor | None = None,
        scope_lease: Callable[[], WriterLease] | None = None,
    ) -> None:
        if retention < 1:
            raise InvalidInput(
                f"checkpoint retention must keep at least 1 automatic checkpoint, not {retention}")
        self._inner = sandbox
        self._journal = journal
        self._audit = audit if audit is not None and audit.path != journal.path else None
        self._markers = intents.Markers(journal.path)
        if min_age < 0:
            raise InvalidInput(f"the minimum age of a prunable checkpoint cannot be negative, not {min_age}")
        self.policy = _validate_policy(policy)
        self.retention = retention
        self.min_age = min_age
        self.retention_bytes = retention_bytes  # a budget on the checkpoints' bytes (retention.py)
        self.broken_promises: tuple[str, ...] = ()  # named checkpoints the last pruning deleted
        self.protected_paths = tuple(protected_paths)
        self.health_command = health_command
        self.health_timeout = health_timeout
        self.health_on = frozenset(validate_trigger(t) for t in health_on)
        self.origin = dict(origin or {})
        self.credentials = dict(credentials or {})  # program -> secret name
        self.lookup = lookup
        self.redactor = redactor if redactor is not None else Redactor()
        self.retention_note = ""  # set when retention had to keep more than it was asked to
        # the sandbox's writer lease (hermes/sync/leases.py), made only when needed: a restore is noted there, so
        # a running Hermes session re-syncs its state, and its files go with the sandbox
        self._scope_lease = scope_lease
        self.restore_token = ""  # the token the last restore through this object noted ("": none)
        if self.policy != "off":
            self._require_checkpoints()

    @property
    def inner(self) -> Sandbox:
        """The wrapped sandbox, for what needs no record (files, background processes)."""
        return self._inner

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def journal(self) -> Journal:
        return self._journal

    def _record(self, record: RecordBase) -> None:
        self._journal.append(record)
        if self._audit is not None:
            self._audit.append(record)

    def _story(self, include_internal: bool = False) -> Story:
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

    # -- commands -------------------------------------------------------------------------------

    def _prepare(self, command: Command, options: CommandOptions) -> _Prepared:
        """Everything before a command starts: its credentials, its automatic checkpoint, its origin,
        and the record written ahead of it (from then on the journal knows it may have run)."""
        self._settle_pending()
        internal = options.get("internal", False)
        record_as = options.get("record_as")
        text = record_as if record_as is not None else command_text(command)
        plan = plan_credentials(text, self.credentials, self.lookup) if not internal else CredentialPlan()
        for name, value in plan.env.items():
            self.redactor.add(name, value)
        auto, verdict = options.get("auto_checkpoint"), RiskVerdict(False, ())
        if not internal and auto is None:
            try:
                auto, verdict = self.checkpoint_if_risky(text, policy=options.get("checkpoint"), cwd=options.get("cwd"))
            except (CheckpointFailed, InvalidInput):
                raise
            except SandboxError as exc:  # fail closed: no checkpoint, no risky command
                raise CheckpointFailed(f"the automatic checkpoint of sandbox {self.name} before this command "
                                       f"failed ({exc}); the command was not run") from exc
        tags = {**(options.get("origin") or {})}
        if plan.used:
            tags["credentials"] = ",".join(plan.used)  # names only, never values
        internal = internal or verdict.internal is not None  # the framework's housekeeping, by its shape
        exec_id = os.urandom(8).hex()
        tag = exec_id if Capability.KILL_TAGGED in self._inner.backend.capabilities else None
        start = ExecStartRecord(sandbox=self.name, id=exec_id, command=text, cwd=options.get("cwd"),
                                checkpoint=auto.id if auto is not None else None,
                                origin={**self.origin, **tags}, internal=internal, owner=liveness.current(),
                                tag=tag)
        self._markers.add(exec_id)  # first: a later call finds it if we die (see settle)
        self._record(start)
        return _Prepared(text, {**(options.get("env") or {}), **plan.env}, tags, plan, auto, verdict, internal,
                         exec_id, {} if tag is None else {"tag": tag})

    def start(self, command: Command, **options: Unpack[CommandOptions]) -> RecordedProcess:
        """Start ``command`` the recorded way: credentials for the programs it runs, an automatic
        checkpoint first if the policy wants one (if it cannot be taken, nothing runs), a record
        written ahead that it starts, and its end journaled when ``wait()`` sees it. See
        ``CommandOptions`` for the options."""
        ready = self._prepare(command, options)
        return self._launched(ready, lambda: self._inner.start(
            command, cwd=options.get("cwd"), env=ready.env, stdin=options.get("stdin"),
            on_stdout=options.get("on_stdout"), on_stderr=options.get("on_stderr"), **ready.tagged))

    def attach(self, command: Command, fds: tuple[int, int, int], **options: Unpack[CommandOptions]) -> RecordedProcess:
        """Run ``command`` on the caller's descriptors (an interactive shell on a terminal, see
        ``Sandbox.attach``) the recorded way, as ``start`` does: written ahead, its end journaled
        when ``wait()`` sees it. ``stdin``, ``on_stdout`` and ``on_stderr`` do not apply."""
        ready = self._prepare(command, options)
        return self._launched(ready, lambda: self._inner.attach(
            command, fds, cwd=options.get("cwd"), env=ready.env, **ready.tagged))

    def _launched(self, ready: _Prepared, launch: Callable[[], Process]) -> RecordedProcess:
        """``launch()``'s process, recorded as ``ready`` describes; a start that fails is journaled."""
        try:
            inner = launch()
        except SandboxError as exc:
            self.record_exec(ready.text, None, 0.0, origin=ready.tags, error=str(exc), internal=ready.internal,
                             exec_id=ready.id)
            raise
        return RecordedProcess(self, inner, ready.text, origin=ready.tags, internal=ready.internal,
                               auto_checkpoint=ready.auto, verdict=ready.verdict, credentials=ready.plan,
                               exec_id=ready.id)

    def exec(self, command: Command, *, timeout: float | None = None, capture_limit: int = 256 * 1024,
             **options: Unpack[CommandOptions]) -> RecordedExec:
        """Run ``command`` to its end (or ``timeout``) the recorded way (see ``start``). A command
        that an interrupt (Ctrl-C, a signal turned into an exception) stops is killed by the
        sandbox's exec and journaled as killed before the interrupt goes on."""
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
        this sandbox's journal: their commands, as lost, each stopped inside first if it still runs
        (see ``lost``; one the sandbox cannot be reached to stop stays open for a later call), and
        their restores and checkpoints, as the sandbox shows them (see ``intents``). Returns the
        records written."""
        written: list[Record] = self._journal_idle_stops()  # first: lost commands may have ended with it
        story = self._story(include_internal=True)
        still_open: set[str] = set()
        for start in story.orphans():
            end = lost.end_of_lost(self._inner, start)
            if end is None:
                still_open.add(start.id)
                continue
            self._record(end)
            written.append(end)
        journaled = set(story.checkpoints)
        for intent in list(story.intents.values()):
            if intent.owner is not None and liveness.alive(intent.owner):
                continue
            ended = intents.settle(self._inner, intent, journaled)
            self._record(ended)
            written.append(ended)
            if isinstance(ended, CheckpointRecord):
                journaled.add(ended.id)
        for dead in set(self._markers.dead()) - still_open:
            self._markers.remove(dead)
        return written

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
                journaled = set(self._story(include_internal=True).checkpoints)
                why = f"it failed ({type(exc).__name__}: {exc})"
                self._record(intents.settle(self._inner, intent, journaled, why))
                self._markers.remove(intent.intent)
            raise
        self._markers.remove(intent.intent)

    def checkpoint_if_risky(self, command: str, *, policy: CheckpointPolicy | None = None,
                            cwd: str | None = None) -> tuple[StoriedCheckpoint | None, RiskVerdict]:
        """The automatic checkpoint before ``command``, when the policy (``policy`` overrides the
        sandbox's) wants one. Raises if it cannot be taken: callers must not run the command then."""
        chosen = self.policy if policy is None else _validate_policy(policy)
        verdict = wants_checkpoint(chosen, command, protected_paths=self.protected_paths,
                                   exists=self._exists, cwd=cwd)
        if not verdict.risky:
            return None, verdict
        self.broken_promises = ()
        if (unchanged := self._unchanged_base()) is not None:
            return unchanged, verdict
        why = f" ({', '.join(verdict.reasons)})" if verdict.reasons else ""
        taken = self.checkpoint(f"before: {_short(command)}{why}", trigger="auto", trigger_command=command)
        return taken, verdict

    def _unchanged_base(self) -> StoriedCheckpoint | None:
        """The checkpoint the sandbox grew from, if the backend can tell nothing changed since but
        the agent framework's scratch files (Hermes rewrites its shell snapshot after every command)."""
        base = self._story().base
        if base is None:
            return None
        try:
            changed = self._inner.changed_since(base)
            # A store that answers cheaply also diffs in proportion to the change: look at what it was.
            if changed is None or (changed and not self._only_scratch_changed(base)):
                return None
            return self.get_checkpoint(base)
        except SandboxError:  # gone, or the backend cannot say: a new checkpoint is the safe answer
            return None

    def _only_scratch_changed(self, base: str) -> bool:
        if Capability.DIFF not in self._inner.backend.capabilities:
            return False
        return all(is_hermes_scratch(c.path) for c in self._inner.diff(base))

    def promise(self, checkpoint_id: str) -> None:
        """Record that ``checkpoint_id`` was named to the agent as the way to undo a command:
        retention keeps the newest such checkpoint whatever its age."""
        self._record(CheckpointNamedRecord(sandbox=self.name, id=checkpoint_id))

    def record_exec(self, command: str, exit_code: int | None, duration_s: float, *, timed_out: bool = False,
                    origin: Mapping[str, str] | None = None, error: str | None = None, killed: bool = False,
                    internal: bool | None = None, exec_id: str | None = None) -> None:
        """Journal (and audit) how a command ended; ``origin`` adds to the sandbox's own tags. Used
        by ``start``/``exec``/``attach`` and by faces that run a command past them.
        ``internal`` marks housekeeping the agent framework sent by itself; None recognises it from
        the text. ``exec_id`` is the id of the record written ahead of the command, if any."""
        if internal is None:
            internal = hermes_internal(command) is not None
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
        by default it runs when one is configured and ``trigger`` is in ``health_on``."""
        trigger = validate_trigger(trigger)
        self._require_checkpoints()
        run_health = self.health_command is not None and (
            trigger in self.health_on if health is None else health)
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
            self._prune()
        return self._enrich(taken, self._story(), live=None)

    def _run_health(self) -> HealthCheck:
        assert self.health_command is not None
        text = command_text(self.health_command)
        try:
            result = self._inner.exec(self.health_command, timeout=self.health_timeout,
                                      capture_limit=4 * MAX_OUTPUT_TAIL_CHARS)
        except SandboxError as exc:  # a broken health check must not cost the user the checkpoint
            return HealthCheck(text, None, False, str(exc))
        output = (result.stdout + result.stderr)[-MAX_OUTPUT_TAIL_CHARS:]
        return HealthCheck(text, result.exit_code, result.ok and not result.timed_out, output)

    def _prune(self) -> None:
        """Delete the automatic checkpoints beyond the newest ``retention``, then while the
        checkpoints' bytes are over ``retention_bytes`` (see retention.py); never the others, nor
        one younger than ``min_age``, nor the newest one named to the agent. A backend that cannot
        delete checkpoints keeps them all, and ``retention_note`` says so."""
        from hermes_sandboxes.recorder import retention  # after an automatic checkpoint only

        story = self._story()
        listed = self._inner.checkpoints()
        autos = [c for c in listed if (told := story.get(c.id)) is not None and told.record.trigger == "auto"]
        wanted = retention.over(autos, listed, keep=self.retention, budget=self.retention_bytes)
        if wanted and Capability.DELETE_CHECKPOINTS not in self._inner.backend.capabilities:
            self.retention_note = (
                f"the {self._inner.backend.name} backend cannot delete checkpoints: all {len(autos)} automatic "
                f"checkpoints of {self.name} are kept (retention asks for {self.retention})")
            import logging  # not for the hot path of an exec

            logging.getLogger(__name__).info("%s", self.retention_note)
            return
        live = {c.id for c in listed}
        newest_named = next((i for i in reversed(story.named) if i in live), None)
        broken: list[str] = []
        for checkpoint in retention.doomed(autos, listed, keep=self.retention, budget=self.retention_bytes,
                                           protected=newest_named, young_after=time.time() - self.min_age):
            try:
                self._inner.delete_checkpoint(checkpoint.id)
            except CheckpointNotFound:
                continue  # another process pruned it first
            self._record(CheckpointDeleteRecord(sandbox=self.name, id=checkpoint.id, reason="retention"))
            if checkpoint.id in story.named:
                broken.append(checkpoint.id)
        self.broken_promises = tuple(broken)

    def checkpoints(self, *, include_internal: bool = False) -> list[StoriedCheckpoint]:
        """The sandbox's checkpoints, oldest first, each with its story (the agent framework's own
        housekeeping commands left out unless ``include_internal``, which also lists the checkpoints a
        service made by itself)."""
        listed = self._inner.all_checkpoints() if include_internal else self._inner.checkpoints()
        story, live = self._story(include_internal), {c.id for c in listed}
        return [self._enrich(c, story, live) for c in listed]

    def get_checkpoint(self, checkpoint_id: str, *, include_internal: bool = False) -> StoriedCheckpoint:
        for checkpoint in self.checkpoints(include_internal=include_internal):
            if checkpoint.id == checkpoint_id:
                return checkpoint
        raise CheckpointNotFound(
            f"sandbox {self.name} has no checkpoint {checkpoint_id!r}; list them with "
            f"`hermes-sandboxes checkpoint list {self.name}`"
        )

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
        what the record compares with (None: not known)."""
        from hermes_sandboxes.egress.policy import validate  # only when a list changes

        entries = validate(allow)
        self._inner.set_allow(entries)
        self._record(AllowRecord(sandbox=self.name, allow=entries,
                                 previous=None if previous is None else tuple(previous)))
        return entries

    def change_allow(self, *, replace: Sequence[str] | None = None, add: Sequence[str] = (),
                     remove: Sequence[str] = ()) -> tuple[str, ...]:
        """The egress allow-list replaced by ``replace``, or the current one with ``add`` and without
        ``remove`` (``policy.edited``), set and recorded as ``set_allow`` does; returns the new list.
        Unsupported where the backend has no allow-list, InvalidInput for a sandbox whose network is
        not "proxy" (chosen at creation) or an entry to remove that the list does not hold.

        The read, the change and the record happen under the sandbox's allow-list lock
        (``allow_lock``), which every face takes (CLI, Hermes command, this API): two changes made
        at once on this host both land, one after the other."""
        from hermes_sandboxes.egress.policy import edited  # only when a list changes

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
        hold it around any read-modify-write of the list."""
        from hermes_sandboxes.hermes.sync.leases import exclusive

        path = self._journal.path
        return exclusive(path.with_name(path.name + ".allow.lock"),
                         what=f"changing the allow-list of sandbox {self.name}")

    # -- restore, delete, destroy ---------------------------------------------------------------

    def restore_preview(self, checkpoint_id: str, *, diff: bool = True,
                        include_internal: bool = False) -> RestorePreview:
        """What restoring ``checkpoint_id`` would throw away; changes nothing. The agent framework's
        housekeeping (its commands and scratch files) is left out unless ``include_internal``."""
        checkpoint = self.get_checkpoint(checkpoint_id, include_internal=include_internal)
        since = self._story(include_internal).commands_since(checkpoint_id, created_at=checkpoint.created_at)
        commands = None if since is None else tuple(since)
        backend = self._inner.backend
        if not diff:
            return RestorePreview(checkpoint, commands, None, None, "not asked for")
        if Capability.DIFF not in backend.capabilities:
            return RestorePreview(checkpoint, commands, None, None,
                                  f"the {backend.name} backend cannot diff checkpoints")
        try:
            changes = tuple(c for c in self._inner.diff(checkpoint_id)
                            if include_internal or not is_hermes_scratch(c.path))
        except Unsupported as exc:
            return RestorePreview(checkpoint, commands, None, None, str(exc))
        from hermes_sandboxes.recorder.diffsummary import summarize  # previews only: off the hot path of exec

        return RestorePreview(checkpoint, commands, changes, summarize(changes))

    def restore(self, checkpoint_id: str, *, include_internal: bool = False) -> list[ExecRecord] | None:
        """Restore and record it; returns the commands thrown away (None: the journal cannot tell),
        the agent framework's own housekeeping left out unless ``include_internal``."""
        self._settle_pending()
        checkpoint = self.get_checkpoint(checkpoint_id)
        discarded = self._story(include_internal).commands_since(checkpoint_id, created_at=checkpoint.created_at)
        ahead = RestoreStartRecord(sandbox=self.name, id=checkpoint_id, intent=intents.token(),
                                   discarded=len(discarded or ()), owner=liveness.current())
        try:
            with self._ahead(ahead):  # recorded as restored exactly when the files are the checkpoint's
                self._inner.restore(checkpoint_id)
                self._record(RestoreRecord(sandbox=self.name, id=checkpoint_id, discarded=ahead.discarded,
                                           intent=ahead.intent))
        except BaseException:
            with contextlib.suppress(Exception):  # a failed restore may have changed files all the same
                self._note_restored()
            raise
        self._note_restored()
        return discarded

    def _note_restored(self) -> None:
        """Tell every Hermes session on this host that the sandbox's files went back in time, so each
        brings its ``~/.hermes`` up to date before its next command: a token beside the journal
        (``restore_noted``: sessions without a writer lease read it) and, while a Hermes process holds
        the scope's writer lease, the lease's restore stamp (hermes/sync/leases.py: its writer re-syncs, readers
        wait). With no holder the stamp is removed again at once: the next writer pushes all anyway."""
        if self._scope_lease is None:
            return
        try:
            lease = self._scope_lease()
            self.restore_token = lease.note_restored()
            _write_token(self._restore_note_path, self.restore_token)
            lease.discard()
        except OSError as exc:
            raise SandboxError(f"sandbox {self.name} was restored, but running Hermes sessions could not be told "
                               f"({exc}); their next command may see stale ~/.hermes files: restart them") from exc

    @property
    def _restore_note_path(self) -> Path:
        path = self._journal.path
        return path.with_name(path.name + ".restored")

    def restore_noted(self) -> str:
        """The token of the last restore of this sandbox noted on this host ("" if none)."""
        try:
            return self._restore_note_path.read_text()
        except FileNotFoundError:
            return ""

    def delete_checkpoint(self, checkpoint_id: str, *, reason: DeleteReason = "manual") -> None:
        self._inner.delete_checkpoint(checkpoint_id)
        self._record(CheckpointDeleteRecord(sandbox=self.name, id=checkpoint_id, reason=reason))

    def destroy(self) -> None:
        self._inner.destroy()
        self._record(DestroyRecord(sandbox=self.name))
        self._markers.clear()  # nothing runs in it any more: nothing to stop
        if self._scope_lease is not None:  # its lease files go with it, unless a Hermes process holds them
            self._scope_lease().discard()

    def close(self) -> None:
        """Close the journal (the audit log may be shared: its owner closes it)."""
        self._journal.close()


def _write_token(path: Path, token: str) -> None:
    """``token`` as ``path``'s whole content, replaced in one rename (a reader never sees half)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    temp.write_text(token)
    os.replace(temp, path)


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
