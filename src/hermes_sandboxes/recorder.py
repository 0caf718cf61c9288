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

Write-ahead is not attempted: a host dying between the backend's checkpoint and the journal append
leaves a checkpoint with no record, which still lists, with trigger ``unknown``.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermes_sandboxes.diffsummary import DiffSummary, summarize
from hermes_sandboxes.errors import CheckpointNotFound, InvalidInput, SandboxError, Unsupported
from hermes_sandboxes.journal import (
    MAX_OUTPUT_TAIL_CHARS,
    CheckpointDeleteRecord,
    CheckpointNamedRecord,
    CheckpointRecord,
    CheckpointStory,
    CreateRecord,
    DeleteReason,
    DestroyRecord,
    ExecRecord,
    HealthCheck,
    Journal,
    RecordBase,
    RedactFn,
    RestoreRecord,
    Story,
    Trigger,
    audit_path,
    command_text,
    journal_path,
    validate_trigger,
)
from hermes_sandboxes.risk import (
    CHECKPOINT_POLICIES,
    CheckpointPolicy,
    RiskVerdict,
    hermes_internal,
    wants_checkpoint,
)
from hermes_sandboxes.risk.internal import is_hermes_scratch
from hermes_sandboxes.sandbox import (
    Capability,
    Checkpoint,
    Command,
    ExecResult,
    FileChange,
    OutputSink,
    Sandbox,
)

DEFAULT_RETENTION = 10
DEFAULT_MIN_AGE = 600.0  # seconds: an automatic checkpoint this young is never pruned
UNKNOWN_TRIGGER = "unknown"  # a checkpoint the journal has no record of (taken by other means)


@dataclass(frozen=True)
class RecordedExec:
    """A command's result, the automatic checkpoint taken just before it (if any) and why."""

    result: ExecResult
    auto_checkpoint: Checkpoint | None
    verdict: RiskVerdict


@dataclass(frozen=True)
class RestorePreview:
    """What restoring ``checkpoint`` would throw away."""

    checkpoint: Checkpoint  # with its story in ``extra``
    commands: tuple[ExecRecord, ...] | None  # None: the journal cannot tell
    changes: tuple[FileChange, ...] | None  # None: no diff (see ``diff_unavailable``)
    summary: DiffSummary | None
    diff_unavailable: str | None = None  # why there is no diff

    def to_dict(self) -> dict[str, Any]:
        return {
            "checkpoint": self.checkpoint.to_dict(),
            "commands": None if self.commands is None else [_command_dict(c) for c in self.commands],
            "summary": self.summary.to_dict() if self.summary else None,
            "diff_unavailable": self.diff_unavailable,
        }


def _command_dict(record: ExecRecord) -> dict[str, Any]:
    return {"command": record.command, "exit_code": record.exit_code, "duration_s": record.duration_s,
            "timed_out": record.timed_out, "ts": record.ts}


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
        protected_paths: Sequence[str] = (),
        health_command: Command | None = None,
        health_timeout: float | None = 600.0,
        health_on: Collection[Trigger] = ("manual", "agent"),
        origin: Mapping[str, str] | None = None,
    ) -> None:
        if retention < 1:
            raise InvalidInput(
                f"checkpoint retention must keep at least 1 automatic checkpoint, not {retention}")
        self._inner = sandbox
        self._journal = journal
        self._audit = audit if audit is not None and audit.path != journal.path else None
        if min_age < 0:
            raise InvalidInput(f"the minimum age of a prunable checkpoint cannot be negative, not {min_age}")
        self.policy = _validate_policy(policy)
        self.retention = retention
        self.min_age = min_age
        self.broken_promises: tuple[str, ...] = ()  # named checkpoints the last pruning deleted
        self.protected_paths = tuple(protected_paths)
        self.health_command = health_command
        self.health_timeout = health_timeout
        self.health_on = frozenset(validate_trigger(t) for t in health_on)
        self.origin = dict(origin or {})
        if self.policy != "off":
            self._require_checkpoints()

    @classmethod
    def at_home(cls, sandbox: Sandbox, home: Path, *, durable: bool = True,
                redact: RedactFn | None = None, **options: Any) -> RecordedSandbox:
        """Wrap ``sandbox`` with the journal and audit log at their conventional paths under ``home``."""
        journal = Journal(journal_path(home, sandbox.name), durable=durable, redact=redact)
        audit = Journal(audit_path(home), durable=durable, redact=redact)
        return cls(sandbox, journal, audit, **options)

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

    def record_create(self) -> None:
        """Note that the sandbox was just created (a new life for its name: older stories end)."""
        self._record(CreateRecord(sandbox=self.name, backend=self._inner.backend.name,
                                  ephemeral=self._inner.ephemeral))

    # -- commands -------------------------------------------------------------------------------

    def exec(
        self,
        command: Command,
        *,
        checkpoint: CheckpointPolicy | None = None,
        origin: Mapping[str, str] | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        timeout: float | None = None,
        on_stdout: OutputSink | None = None,
        on_stderr: OutputSink | None = None,
        capture_limit: int = 256 * 1024,
    ) -> RecordedExec:
        """Run ``command`` after an automatic checkpoint if the policy (``checkpoint`` overrides the
        sandbox's) wants one. ``env`` is passed on and never recorded."""
        text = command_text(command)
        auto, verdict = self.checkpoint_if_risky(text, policy=checkpoint, cwd=cwd)
        started = time.monotonic()
        try:
            result = self._inner.exec(command, cwd=cwd, env=env, stdin=stdin, timeout=timeout,
                                      on_stdout=on_stdout, on_stderr=on_stderr, capture_limit=capture_limit)
        except SandboxError as exc:
            self.record_exec(text, None, time.monotonic() - started, origin=origin, error=str(exc),
                             internal=verdict.internal is not None)
            raise
        self.record_exec(text, result.exit_code, result.duration_s, timed_out=result.timed_out, origin=origin,
                         internal=verdict.internal is not None)
        return RecordedExec(result, auto, verdict)

    def checkpoint_if_risky(self, command: str, *, policy: CheckpointPolicy | None = None,
                            cwd: str | None = None) -> tuple[Checkpoint | None, RiskVerdict]:
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

    def _unchanged_base(self) -> Checkpoint | None:
        """The checkpoint the sandbox grew from, if the backend can tell nothing changed since but
        the agent framework's scratch files (Hermes rewrites its shell snapshot after every command)."""
        base = self._story().base
        changed_since = getattr(self._inner, "changed_since", None)  # contract: Sandbox.changed_since
        if base is None or changed_since is None:
            return None
        try:
            changed = changed_since(base)
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
                    origin: Mapping[str, str] | None = None, error: str | None = None,
                    internal: bool | None = None) -> None:
        """Journal (and audit) a command that ran through another path than ``exec``, e.g. a
        streaming start() driven by a caller; ``origin`` adds to the sandbox's own tags. ``internal``
        marks housekeeping the agent framework sent by itself; None recognises it from the text."""
        if internal is None:
            internal = hermes_internal(command) is not None
        self._record(ExecRecord(sandbox=self.name, command=command, exit_code=exit_code,
                                duration_s=duration_s, timed_out=timed_out,
                                origin={**self.origin, **(origin or {})}, error=error, internal=internal))

    def _exists(self, path: str) -> bool:
        """Whether ``path`` exists in the sandbox; the classifier asks only about redirect targets
        under protected paths. When we cannot tell, say yes: a needless checkpoint is cheap."""
        try:
            return self._inner.exec(["test", "-e", path], timeout=30).exit_code != 1
        except SandboxError:
            return True

    # -- checkpoints ----------------------------------------------------------------------------

    def checkpoint(self, comment: str = "", *, trigger: Trigger = "manual",
                   trigger_command: str | None = None, health: bool | None = None) -> Checkpoint:
        """Take a checkpoint and record its story. ``health`` forces the health command on or off;
        by default it runs when one is configured and ``trigger`` is in ``health_on``."""
        trigger = validate_trigger(trigger)
        self._require_checkpoints()
        run_health = self.health_command is not None and (
            trigger in self.health_on if health is None else health)
        checked = self._run_health() if run_health else None
        taken = self._inner.checkpoint(comment)
        # the size the backend reports with the checkpoint (None when it measures lazily, as the
        # local backend does: walking a big layer here would cost more than the snapshot)
        self._record(CheckpointRecord(sandbox=self.name, id=taken.id, comment=comment, trigger=trigger,
                                      trigger_command=trigger_command, layer_bytes=taken.size_bytes,
                                      health=checked))
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
        """Delete the automatic checkpoints beyond the newest ``retention``; never the others, nor
        one younger than ``min_age``, nor the newest one named to the agent."""
        story = self._story()
        listed = self._inner.checkpoints()
        autos = [c for c in listed if (told := story.get(c.id)) is not None and told.record.trigger == "auto"]
        live = {c.id for c in listed}
        newest_named = next((i for i in reversed(story.named) if i in live), None)
        young = time.time() - self.min_age
        broken: list[str] = []
        for checkpoint in autos[: max(0, len(autos) - self.retention)]:
            if checkpoint.id == newest_named or checkpoint.created_at > young:
                continue
            try:
                self._inner.delete_checkpoint(checkpoint.id)
            except CheckpointNotFound:
                continue  # another process pruned it first
            self._record(CheckpointDeleteRecord(sandbox=self.name, id=checkpoint.id, reason="retention"))
            if checkpoint.id in story.named:
                broken.append(checkpoint.id)
        self.broken_promises = tuple(broken)

    def checkpoints(self, *, include_internal: bool = False) -> list[Checkpoint]:
        """The sandbox's checkpoints, oldest first, each with its story in ``extra`` (the agent
        framework's own housekeeping commands left out unless ``include_internal``)."""
        listed = self._inner.checkpoints()
        story, live = self._story(include_internal), {c.id for c in listed}
        return [self._enrich(c, story, live) for c in listed]

    def get_checkpoint(self, checkpoint_id: str, *, include_internal: bool = False) -> Checkpoint:
        for checkpoint in self.checkpoints(include_internal=include_internal):
            if checkpoint.id == checkpoint_id:
                return checkpoint
        raise CheckpointNotFound(
            f"sandbox {self.name} has no checkpoint {checkpoint_id!r}; list them with "
            f"`hermes-sandboxes checkpoint list {self.name}`"
        )

    def _enrich(self, checkpoint: Checkpoint, story: Story, live: Collection[str] | None) -> Checkpoint:
        """``checkpoint`` with its story; ``live`` (the ids that still exist) lets the story skip over
        deleted checkpoints, None takes it as recorded."""
        told = story.get(checkpoint.id)
        if told is None:
            extra: dict[str, Any] = {
                "trigger": UNKNOWN_TRIGGER, "trigger_command": None, "previous": None, "commands": [],
                "health": None, "layer_bytes": None, "journaled": False,
            }
            return Checkpoint(checkpoint.id, checkpoint.created_at, checkpoint.comment,
                              checkpoint.size_bytes, {**checkpoint.extra, **extra})
        previous, commands = (told.previous, list(told.commands)) if live is None else (
            _since_listed(told, story, live))
        record = told.record
        size = checkpoint.size_bytes if checkpoint.size_bytes is not None else record.layer_bytes
        extra = {
            "trigger": record.trigger,
            "trigger_command": record.trigger_command,
            "previous": previous,
            "commands": [_command_dict(c) for c in commands],
            "health": record.health.to_dict() if record.health else None,
            "layer_bytes": size,
            "journaled": True,
        }
        return Checkpoint(checkpoint.id, checkpoint.created_at, checkpoint.comment or record.comment,
                          size, {**checkpoint.extra, **extra})

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
        return RestorePreview(checkpoint, commands, changes, summarize(changes))

    def restore(self, checkpoint_id: str, *, include_internal: bool = False) -> list[ExecRecord] | None:
        """Restore and record it; returns the commands thrown away (None: the journal cannot tell),
        the agent framework's own housekeeping left out unless ``include_internal``."""
        checkpoint = self.get_checkpoint(checkpoint_id)
        discarded = self._story(include_internal).commands_since(checkpoint_id, created_at=checkpoint.created_at)
        self._inner.restore(checkpoint_id)
        self._record(RestoreRecord(sandbox=self.name, id=checkpoint_id, discarded=len(discarded or ())))
        return discarded

    def delete_checkpoint(self, checkpoint_id: str, *, reason: DeleteReason = "manual") -> None:
        self._inner.delete_checkpoint(checkpoint_id)
        self._record(CheckpointDeleteRecord(sandbox=self.name, id=checkpoint_id, reason=reason))

    def destroy(self) -> None:
        self._inner.destroy()
        self._record(DestroyRecord(sandbox=self.name))


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
