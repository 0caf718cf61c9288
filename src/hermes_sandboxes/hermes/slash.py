"""``/sandbox``: the person in a Hermes conversation (the CLI chat, a Telegram, Discord or Slack
gateway) looks at and rolls back the conversation's sandbox.

Hermes refuses its own ``/rollback`` for container-type terminal backends, ours included; this is
the way to undo from the chat. Subcommands::

    /sandbox                       status: backend, sandbox, state, last checkpoint, what changed since
    /sandbox log                   the last commands and checkpoints
    /sandbox checkpoints           the checkpoints, newest first
    /sandbox diff [ID]             files changed since ID (default: the undo point)
    /sandbox checkpoint [COMMENT]  take a checkpoint now
    /sandbox undo [ID] [--yes]     go back to ID (default: the newest checkpoint named to the agent or
                                   taken by a person); without --yes it only shows what would be lost
    /sandbox fork ID NAME          a new sandbox from checkpoint ID; this one is untouched

No gateway of this Hermes (0.22.2) offers a confirmation dialog to plugin commands, so the
confirmation is the second command, ``/sandbox undo ID --yes``, which the preview spells out.
Output is plain text that reads the same in a terminal and in a chat message: no box drawing, one
item a line, long lists cut with a count of what was left out. Every error is one line, and the
handler never raises into Hermes.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Sequence
from typing import Any

from hermes_sandboxes.errors import SandboxError, Unsupported
from hermes_sandboxes.hermes import conversation, naming
from hermes_sandboxes.hermes.conversation import Target
from hermes_sandboxes.recorder.records import CheckpointRecord, ExecRecord, RestoreRecord
from hermes_sandboxes.recorder.sandbox import RestorePreview, StoriedCheckpoint
from hermes_sandboxes.sandbox import Capability

NAME = "sandbox"
ARGS_HINT = "[log|checkpoints|diff [ID]|checkpoint [COMMENT]|undo [ID] [--yes]|fork ID NAME]"
DESCRIPTION = "This conversation's sandbox: status, log, checkpoints, diff, checkpoint, undo, fork"
MAX_ROWS = 15
MAX_PATHS = 12
# what the agent is told of the files after an undo: every change since the checkpoint is gone,
# not counted (a confirmed undo takes no diff)
NOT_COUNTED = "every change since that checkpoint is gone (not counted: an undo takes no diff)"


def _one_line(text: str, limit: int = 70) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _ago(ts: float) -> str:
    seconds = max(0, int(time.time() - ts))
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit} ago"
    return f"{seconds} s ago"


def _duration(seconds: float) -> str:
    for unit, size in (("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)} {unit}"
    return f"{seconds:g} s"


def _cut(lines: list[str], total: int, what: str) -> list[str]:
    """``lines`` (the first of ``total``), with a line counting what was left out."""
    if total > len(lines):
        lines.append(f"  … and {total - len(lines)} more {what}")
    return lines


def _checkpoint_line(cp: StoriedCheckpoint) -> str:
    comment = cp.comment or (f"before: {cp.trigger_command}" if cp.trigger_command else "")
    return f"{cp.id}  {_ago(cp.created_at)}  [{cp.trigger}]  {_one_line(comment)}".rstrip()


def _command_line(record: ExecRecord) -> str:
    code = "?" if record.exit_code is None else str(record.exit_code)
    return f"[exit {code}] {_one_line(record.command, 90)}"


def undo_point(target: Target) -> StoriedCheckpoint | None:
    """The newest checkpoint named to the agent (as the undo of a command, or one it took) or taken by
    a person; automatic checkpoints nobody was told of do not count."""
    story = target.recorded.journal.story(target.name)
    named = set(story.named)
    told = [cp for cp in target.recorded.checkpoints() if cp.id in named or cp.trigger in ("manual", "agent")]
    return max(told, key=lambda cp: cp.created_at, default=None)


def _changes_text(preview: RestorePreview) -> str:
    if preview.summary is None:
        return f"changes unknown ({preview.diff_unavailable})"
    total = preview.summary.total
    return (f"{total.files} path(s) changed: {total.added} added, {total.modified} modified, "
            f"{total.deleted} deleted")


def _preview_lines(preview: RestorePreview, *, files: bool = True, commands: bool = True) -> list[str]:
    lines = [f"Files: {_changes_text(preview)}"] if files else []
    if files and preview.changes:
        shown = [f"  {c.kind.value:<8} {c.path}" for c in preview.changes[:MAX_PATHS]]
        lines += _cut(shown, len(preview.changes), "path(s)")
    if not commands:
        return lines
    ran = preview.commands
    if ran is None:
        lines.append("Commands since: unknown (the journal has no record of this checkpoint)")
    else:
        lines.append(f"Commands since: {len(ran)}")
        shown = [f"  {_command_line(r)}" for r in ran[-MAX_ROWS:]]
        if len(ran) > len(shown):
            shown.insert(0, f"  … {len(ran) - len(shown)} earlier command(s)")
        lines += shown
    return lines


# --- subcommands -------------------------------------------------------------------------------------
def status(target: Target, args: Sequence[str]) -> str:
    info = target.recorded.inner.info()
    idle = info.spec.idle_timeout
    stops = f" (idle timeout {_duration(idle)}: stopped after that long without a command)" if idle else ""
    lines = [f"Sandbox {target.name} ({target.recorded.inner.backend.name} backend), {info.state.value}{stops}"]
    point = undo_point(target)
    listed = target.recorded.checkpoints()
    if not listed:
        lines.append("No checkpoints yet: /sandbox checkpoint [COMMENT] takes one.")
        return "\n".join(lines)
    last = listed[-1]
    lines.append(f"Last checkpoint: {_checkpoint_line(last)}")
    preview = target.recorded.restore_preview(last.id)
    commands = "unknown" if preview.commands is None else str(len(preview.commands))
    lines.append(f"Since then: {commands} command(s); {_changes_text(preview)}")
    if point is not None:
        lines.append(f"/sandbox undo goes back to {point.id} ({_ago(point.created_at)}).")
    return "\n".join(lines)


def log(target: Target, args: Sequence[str]) -> str:
    records = [r for r in target.recorded.journal.records(sandbox=target.name)
               if isinstance(r, CheckpointRecord | RestoreRecord)
               or (isinstance(r, ExecRecord) and not r.internal)]
    if not records:
        return f"Nothing recorded in {target.name} yet."
    lines = []
    for r in records[-MAX_ROWS:]:
        when = time.strftime("%H:%M:%S", time.localtime(r.ts))
        if isinstance(r, ExecRecord):
            lines.append(f"{when}  {_command_line(r)}")
        elif isinstance(r, CheckpointRecord):
            lines.append(f"{when}  checkpoint {r.id} [{r.trigger}] {_one_line(r.comment, 60)}".rstrip())
        else:
            lines.append(f"{when}  restored to {r.id}, discarding {r.discarded} command(s)")
    if len(records) > len(lines):
        lines.insert(0, f"… {len(records) - len(lines)} earlier event(s) (hermes-sandboxes log {target.name})")
    return "\n".join([f"Log of {target.name}, oldest first:", *lines])


def checkpoints(target: Target, args: Sequence[str]) -> str:
    listed = list(reversed(target.recorded.checkpoints()))
    if not listed:
        return f"{target.name} has no checkpoints yet: /sandbox checkpoint [COMMENT] takes one."
    lines = _cut([_checkpoint_line(cp) for cp in listed[:MAX_ROWS]], len(listed), "older checkpoint(s)")
    note = target.recorded.retention_note
    return "\n".join([f"Checkpoints of {target.name}, newest first:", *lines, *([note] if note else [])])


def _chosen(target: Target, args: Sequence[str]) -> StoriedCheckpoint:
    if args:
        return target.recorded.get_checkpoint(args[0])
    point = undo_point(target)
    if point is None:
        raise SandboxError(f"{target.name} has no checkpoint to go back to; name one (see /sandbox checkpoints)")
    return point


def diff(target: Target, args: Sequence[str]) -> str:
    cp = _chosen(target, args[:1])
    if Capability.DIFF not in target.recorded.inner.backend.capabilities:
        lines = _preview_lines(target.recorded.restore_preview(cp.id, diff=False), files=False)
        return "\n".join([f"The {target.recorded.inner.backend.name} backend cannot diff checkpoints; "
                          f"what ran since {cp.id}:", *lines])
    preview = target.recorded.restore_preview(cp.id)
    return "\n".join([f"Since {_checkpoint_line(cp)}:", *_preview_lines(preview, commands=False)])


def checkpoint(target: Target, args: Sequence[str]) -> str:
    comment = " ".join(args).strip() or "taken from the chat"
    with target.busy():
        cp = target.recorded.checkpoint(comment, trigger="manual")
    return f"Saved checkpoint {cp.id} of {target.name}: {comment}\n/sandbox undo {cp.id} --yes returns to it."


def undo(target: Target, args: Sequence[str]) -> str:
    yes = "--yes" in args or "-y" in args
    rest = [a for a in args if a not in ("--yes", "-y")]
    cp = _chosen(target, rest[:1])
    # the confirmed undo takes no diff: it must not wait on a tree built to be slow to compare
    # (issue 24); the commands it discards come from the one reading of the journal
    preview = target.recorded.restore_preview(cp.id, diff=not yes)
    if not yes:
        return "\n".join([f"Undo in {target.name} back to {_checkpoint_line(cp)}", "This throws away:",
                          *_preview_lines(preview), f"To go ahead: /sandbox undo {cp.id} --yes"])
    with target.busy():
        discarded = target.recorded.restore(preview)  # what the preview found: one pass
        if target.env is not None:
            target.env.after_restore()  # re-send what Hermes syncs, fresh shell snapshot
    conversation.leave_note(target.recorded, cp.id, discarded, NOT_COUNTED)
    lost = "an unknown number of" if discarded is None else str(len(discarded))
    return (f"Undone: {target.name} is back at {cp.id}; {lost} command(s) and their file changes are gone, "
            "running processes were stopped. The agent is told at the start of its next turn.")


def fork(target: Target, args: Sequence[str]) -> str:
    if len(args) != 2:
        raise SandboxError("usage: /sandbox fork ID NAME")
    checkpoint_id, wanted = args
    backend = target.recorded.inner.backend
    if Capability.FORK not in backend.capabilities:
        raise Unsupported(f"the {backend.name} backend cannot fork sandboxes; nothing was changed")
    settings = target.provider.settings()
    prefix = settings.name_prefix
    name = wanted if naming.within_prefix(prefix, wanted) else f"{prefix}-{wanted}"
    target.recorded.get_checkpoint(checkpoint_id)
    forked = target.recorded.inner.fork(naming.require_within_prefix(prefix, name), checkpoint_id)
    from hermes_sandboxes.recorder.credentials import Redactor

    target.provider.recorded(forked, settings, Redactor()).record_create(forked_from=f"{target.name}@{checkpoint_id}")
    return (f"Forked {target.name} at {checkpoint_id} into {forked.name}; this conversation keeps using "
            f"{target.name}. Use the fork with: hermes-sandboxes shell {forked.name}")


SUBCOMMANDS: dict[str, Callable[[Target, Sequence[str]], str]] = {
    "status": status, "log": log, "checkpoints": checkpoints, "diff": diff, "checkpoint": checkpoint,
    "undo": undo, "fork": fork,
}


def handle(raw_args: str) -> str:
    """Hermes's handler of ``/sandbox ...`` (``raw_args``: what follows the command)."""
    try:
        words = shlex.split(raw_args or "")
    except ValueError as exc:
        return f"/sandbox: {exc}"
    sub, args = (words[0].lower(), words[1:]) if words else ("status", [])
    if sub in ("help", "-h", "--help"):
        return __doc__.split("Subcommands::", 1)[1].split("No gateway", 1)[0].strip("\n")
    run = SUBCOMMANDS.get(sub)
    if run is None:
        return f"/sandbox: unknown subcommand {sub!r}; use one of {', '.join(SUBCOMMANDS)} (or /sandbox help)"
    try:
        return run(conversation.find(), args)
    except SandboxError as exc:
        return f"/sandbox {sub}: {exc}"
    except LookupError as exc:
        return f"/sandbox {sub}: {exc}"


def register_slash(ctx: Any) -> None:
    """The ``/sandbox`` command and the pre-turn hook that tells the agent about an undo."""
    if hasattr(ctx, "register_command"):
        ctx.register_command(NAME, handle, description=DESCRIPTION, args_hint=ARGS_HINT)
    if hasattr(ctx, "register_hook"):
        ctx.register_hook("pre_llm_call", conversation.pre_llm_call)
