"""Checkpoint commands (create, list, show, diff, restore, rm) and ``log``, the audit trail.

The story columns (trigger, commands since the previous checkpoint) come from the recorder's
journal; they read ``-`` for a checkpoint it has no record of.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import click

from hermes_sandboxes.cli import signals
from hermes_sandboxes.cli.session import Session, Workspace
from hermes_sandboxes.errors import SandboxNotFound, Unsupported
from hermes_sandboxes.names import validate_name
from hermes_sandboxes.recorder.diffsummary import DEFAULT_MAX_ROWS, full_listing, summarize
from hermes_sandboxes.recorder.journal import (
    AbandonedRecord,
    AllowRecord,
    CheckpointDeleteRecord,
    CheckpointNamedRecord,
    CheckpointRecord,
    CheckpointStartRecord,
    CreateRecord,
    DestroyRecord,
    EgressRecord,
    ExecRecord,
    ForkRecord,
    Record,
    RestoreRecord,
    RestoreStartRecord,
    StopRecord,
)
from hermes_sandboxes.recorder.liveness import alive
from hermes_sandboxes.recorder.sandbox import RestorePreview, StoriedCheckpoint
from hermes_sandboxes.recorder.story import as_shown, with_journal
from hermes_sandboxes.risk.internal import is_hermes_scratch
from hermes_sandboxes.sandbox import TIMEOUT_EXIT_CODE, Capability, ChangeKind, FileChange
from hermes_sandboxes.ui.output import (
    Ui,
    age,
    clock,
    confirm,
    duration,
    error,
    human_size,
    is_stdin_tty,
    one_line,
    summary_table,
)

EXIT_CANCELLED = 1
EXIT_HEALTH_FAILED = 1
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


def _session(workspace: Workspace, name: str) -> Session:
    return workspace.session(workspace.sandbox(name))


def _settled(workspace: Workspace, name: str) -> Session:
    """The session, after stopping inside and recording as lost the commands whose CLI died before
    they ended (so a checkpoint's story and a restore's preview count them as ended before this)."""
    session = _session(workspace, name)
    session.recorded.settle()
    return session


@click.group()
def checkpoint() -> None:
    """Save, list, inspect and restore a sandbox's state."""


@checkpoint.command(name="create")
@click.argument("name")
@click.option("-m", "--message", "comment", default="", help="What this state is (e.g. 'tests pass').")
@click.option("--health", metavar="COMMAND", default=None,
              help="Run COMMAND inside first (e.g. the test suite) and keep its result with the checkpoint; "
                   "exit 1 when it fails (the checkpoint is kept, marked FAILED in `checkpoint list`).")
@click.option("--health-timeout", type=click.FloatRange(min=0, min_open=True), default=600.0, show_default=True,
              metavar="SECONDS", help="Kill the health command after this long; it counts as failed.")
@click.pass_obj
def create_checkpoint(workspace: Workspace, name: str, comment: str, health: str | None,
                      health_timeout: float) -> int:
    """Checkpoint NAME now; prints the checkpoint's id."""
    ui = Ui()
    session = _settled(workspace, name)
    started = time.monotonic()
    cheap = Capability.CHEAP_CHECKPOINTS in session.sandbox.backend.capabilities
    # without a health command, a signal waits for the checkpoint and its record, so the two agree;
    # a health command (the test suite, say) stays interruptible, and Ctrl-C then takes nothing
    held = signals.held() if health is None else contextlib.nullcontext()
    with held, ui.status(f"checkpointing {name}…" if cheap else f"checkpointing {name} (a full copy of what "
                         "it changed: this takes longer the more it changed)…"):
        taken = session.checkpoint(comment, health=health, health_timeout=health_timeout)
        session.close()
        ui.result(taken.id)
    ui.note(f"checkpoint of {name} taken in {duration(time.monotonic() - started)}")
    if taken.health is not None and not taken.health.passed:
        code = "timed out" if taken.health.exit_code == TIMEOUT_EXIT_CODE else f"exit {taken.health.exit_code}"
        error(f"health check FAILED ({code}): {taken.health.command}; the checkpoint {taken.id} was kept and "
              f"is marked failed (see: hermes-sandboxes checkpoint show {name} {taken.id})")
        return EXIT_HEALTH_FAILED
    return 0


@checkpoint.command(name="list")
@click.argument("name")
@click.option("--all", "show_all", is_flag=True,
              help="Also the checkpoints the service made by itself (Sprites' automatic ones) and the "
                   "agent framework's own commands.")
@json_option
@click.pass_obj
def list_checkpoints(workspace: Workspace, name: str, show_all: bool, as_json: bool) -> None:
    """NAME's checkpoints, newest first, with their story."""
    ui = Ui()
    session = _session(workspace, name)
    taken = list(reversed(session.checkpoints(include_internal=show_all)))
    if as_json:
        ui.json([c.to_dict() for c in taken])
        return
    if not taken:
        ui.note(f"{name} has no checkpoints; take one with: hermes-sandboxes checkpoint create {name}")
        return
    rows = [[c.id, age(c.created_at), _trigger(c), one_line(c.comment) or "-", _commands_count(c),
             human_size(c.layer_bytes), _health(c)] for c in taken]
    ui.table(["ID", "AGE", "TRIGGER", "COMMENT", "COMMANDS", "SIZE", "HEALTH"], rows)


def _health(c: StoriedCheckpoint) -> str:
    if c.health is None:
        return "-"
    return "passed" if c.health.passed else "FAILED"


def _trigger(c: StoriedCheckpoint) -> str:
    return c.trigger if c.journaled else "-"


def _commands(c: StoriedCheckpoint) -> list[Mapping[str, Any]] | None:
    return [r.to_summary() for r in c.commands] if c.journaled else None


def _commands_count(c: StoriedCheckpoint) -> str:
    return str(len(c.commands)) if c.journaled else "-"


ALL_HELP = "Also the commands the agent framework sent by itself (Hermes's file helpers, polls, kernel)."


@checkpoint.command(name="show")
@click.argument("name")
@click.argument("checkpoint_id", metavar="ID")
@click.option("--all", "show_all", is_flag=True, help=ALL_HELP)
@json_option
@click.pass_obj
def show_checkpoint(workspace: Workspace, name: str, checkpoint_id: str, show_all: bool, as_json: bool) -> None:
    """Everything known about one checkpoint: when, why, and what ran before it."""
    ui = Ui()
    c = _session(workspace, name).recorded.get_checkpoint(checkpoint_id, include_internal=show_all)
    if as_json:
        ui.json(c.to_dict())
        return
    health = c.health
    fields = [
        ("id", c.id),
        ("created", f"{clock(c.created_at)} ({age(c.created_at)} ago)"),
        ("comment", c.comment or "-"),
        ("trigger", _trigger(c)),
        ("trigger command", c.trigger_command or "-"),
        ("previous", c.previous or "-"),
        ("size", human_size(c.layer_bytes)),
        ("health", "-" if health is None else
         f"{'passed' if health.passed else 'FAILED'}: {health.command} (exit {health.exit_code})"),
    ]
    ui.table(["FIELD", "VALUE"], [[k, v] for k, v in fields])
    commands = _commands(c)
    if commands is None:
        ui.note("no journal for this checkpoint: the commands before it are unknown")
    elif commands:
        _commands_table(ui, commands, title="commands since the previous checkpoint")
    else:
        ui.line("no commands since the previous checkpoint")


def _commands_table(ui: Ui, commands: Sequence[Mapping[str, Any]], *, title: str) -> None:
    rows = [[clock(float(c.get("ts") or 0)), _exit_text(c.get("exit_code"), bool(c.get("timed_out")), _ending(c)),
             duration(c.get("duration_s")),
             one_line(str(c.get("command", "")), 80) + (f"  ({c['error']})" if c.get("error") else "")]
            for c in commands]
    ui.table(["TIME", "EXIT", "TOOK", "COMMAND"], rows, title=title)


def _exit_text(code: object, timed_out: bool = False, ending: str | None = None) -> str:
    if ending is not None:
        return ending
    if timed_out:
        return "timeout"
    return "-" if code is None else str(code)


def _ending(command: Mapping[str, Any]) -> str | None:
    """How a command with no exit code to show ended: "lost" (its recording process died before it
    did) or "running" (written ahead, no end recorded yet, its recorder still alive)."""
    if command.get("lost"):
        return "lost"
    return "running" if command.get("unfinished") else None


@checkpoint.command(name="diff")
@click.argument("name")
@click.argument("from_id", metavar="ID")
@click.argument("to_id", metavar="[ID2]", required=False)
@click.option("--full", is_flag=True, help="Every changed file, not a summary by directory.")
@click.option("--all", "show_all", is_flag=True, help="Also Hermes's scratch files (/tmp/hermes-snap-* ...).")
@json_option
@click.pass_obj
def diff_checkpoint(workspace: Workspace, name: str, from_id: str, to_id: str | None, full: bool,
                    show_all: bool, as_json: bool) -> None:
    """What changed since checkpoint ID (or between ID and ID2)."""
    ui = Ui()
    session = _session(workspace, name)
    with ui.status("comparing…"):
        changes = [c for c in session.diff(from_id, to_id) if show_all or not is_hermes_scratch(c.path)]
    summary = summarize(changes)
    if as_json:
        data: dict[str, Any] = {"from": from_id, "to": to_id, "summary": summary.to_dict()}
        if full:
            data["changes"] = [_change_dict(c) for c in full_listing(changes)]
        ui.json(data)
        return
    target = to_id or "now"
    if not changes:
        ui.line(f"no changes from {from_id} to {target}")
        return
    if full:
        ui.table(["", "PATH", "SIZE"], [[_marker(c), c.path, _change_size(c)] for c in full_listing(changes)],
                 title=f"changes from {from_id} to {target}")
    else:
        summary_table(ui, summary.to_dict(), title=f"changes from {from_id} to {target}")


def _change_dict(c: FileChange) -> dict[str, Any]:
    return {"path": c.path, "kind": str(c.kind), "size": c.size, "old_size": c.old_size}


def _marker(c: FileChange) -> str:
    return {ChangeKind.ADDED: "+", ChangeKind.MODIFIED: "~", ChangeKind.DELETED: "-"}[c.kind]


def _change_size(c: FileChange) -> str:
    if c.kind is ChangeKind.MODIFIED and c.old_size is not None:
        return f"{human_size(c.old_size)} -> {human_size(c.size)}"
    return human_size(c.size if c.kind is not ChangeKind.DELETED else c.old_size)


@checkpoint.command(name="restore")
@click.argument("name")
@click.argument("checkpoint_id", metavar="ID")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def restore_checkpoint(workspace: Workspace, name: str, checkpoint_id: str, yes: bool) -> int:
    """Return NAME to checkpoint ID, after showing what that throws away (with --yes: the commands
    since it; the files are not counted, see `checkpoint diff`)."""
    ui = Ui()
    session = _session(workspace, name)
    # one pass: the journal read once (what dead processes left open settled from it), the
    # checkpoints listed once; an unknown id is one line, before any refusal
    preview = session.preview(checkpoint_id, diff=False, settle=True)
    if not yes and not is_stdin_tty():
        confirm("", yes=yes, refusal=f"not restoring {name}")  # refuses: nobody can be asked
    if yes:
        # an undo never waits on a diff: a tree built to be slow to compare must not hold it back
        # (issue 24), and nobody reads a preview that asks nothing; the commands come from the
        # journal already read
        preview = replace(preview, diff_unavailable=_not_counted(session, name, checkpoint_id))
    else:
        with ui.status("working out what a restore would discard…"):
            preview = session.recorded.with_diff(preview)
    show_preview(ui, preview)
    if not confirm(f"Restore {name} to {checkpoint_id} and discard all of the above?", yes=yes,
                   refusal=f"not restoring {name}"):
        error("restore cancelled; nothing was changed")
        return EXIT_CANCELLED
    started = time.monotonic()
    # a signal now waits until the restore is applied, recorded and reported (then we exit 128+N):
    # an interrupted restore is never applied without the journal and the user knowing
    with signals.held():
        with ui.status(f"restoring {name} to {checkpoint_id}…"):
            session.restore(preview)
        session.close()
        ui.note(f"restored {name} to {checkpoint_id} in {duration(time.monotonic() - started)}", style="green")
    return 0


def _not_counted(session: Session, name: str, checkpoint_id: str) -> str:
    backend = session.sandbox.backend
    if Capability.DIFF not in backend.capabilities:
        return f"the {backend.name} backend cannot diff checkpoints"
    return f"not counted with --yes; hermes-sandboxes checkpoint diff {name} {checkpoint_id} lists them"


def show_preview(ui: Ui, preview: RestorePreview, *, max_rows: int = DEFAULT_MAX_ROWS) -> None:
    c = preview.checkpoint
    comment = f" \"{one_line(c.comment)}\"" if c.comment else ""
    ui.line(f"Restoring to {c.id}{comment}, taken {age(c.created_at)} ago, throws away:", style="bold")
    if preview.summary is None:
        ui.line(f"  file changes: unknown ({preview.diff_unavailable})")
    elif not preview.changes:
        ui.line("  no file changes")
    else:
        summary = preview.summary if max_rows == DEFAULT_MAX_ROWS else summarize(preview.changes, max_rows=max_rows)
        summary_table(ui, summary.to_dict(), title="file changes since the checkpoint")
    if preview.commands is None:
        ui.line("  commands since: unknown (no journal for this checkpoint)")
    elif not preview.commands:
        ui.line("  no commands since the checkpoint")
    else:
        # with why a command ended early (interrupted by SIGINT, ...), as ``log`` shows it: a bare 137
        # or 130 would not say that the command was stopped before its end
        _commands_table(ui, [{**r.to_summary(), "error": r.error} for r in preview.commands],
                        title="commands since the checkpoint")


@checkpoint.command(name="rm")
@click.argument("name")
@click.argument("checkpoint_id", metavar="ID")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def remove_checkpoint(workspace: Workspace, name: str, checkpoint_id: str, yes: bool) -> int:
    """Delete checkpoint ID of NAME (its files cannot be restored afterwards)."""
    ui = Ui()
    session = _session(workspace, name)
    c = session.recorded.get_checkpoint(checkpoint_id)  # unknown id: one line, before any question
    backend = session.sandbox.backend
    if Capability.DELETE_CHECKPOINTS not in backend.capabilities:
        raise Unsupported(f"the {backend.name} backend cannot delete checkpoints; nothing was changed")
    if not yes and is_stdin_tty():
        comment = f" \"{one_line(c.comment)}\"" if c.comment else ""
        ui.line(f"Checkpoint {c.id}{comment}, taken {age(c.created_at)} ago ({_trigger(c)}), "
                f"{human_size(c.layer_bytes)}", style="bold")
    if not confirm(f"Delete checkpoint {checkpoint_id} of {name}?", yes=yes,
                   refusal=f"not deleting checkpoint {checkpoint_id} of {name}"):
        error("cancelled; nothing was changed")
        return EXIT_CANCELLED
    with signals.held():
        session.delete_checkpoint(checkpoint_id)
        session.close()
    ui.note(f"deleted checkpoint {checkpoint_id} of {name}")
    return 0


# -- log ---------------------------------------------------------------------------------------


@click.command(short_help="A sandbox's audit trail.")
@click.argument("name")
@click.option("--all", "show_all", is_flag=True, help=ALL_HELP)
@json_option
@click.pass_obj
def log(workspace: Workspace, name: str, show_all: bool, as_json: bool) -> None:
    """NAME's audit trail: commands, checkpoints, restores and deletions, oldest first.

    Also works for a sandbox that was destroyed, as long as its history is in the audit log. A
    command whose end is not recorded shows as running while the process that started it lives,
    and as lost once that process died before it (kill -9, a crash): the next call that uses the
    sandbox, or gc, stops it inside if it still runs and records that. What the sandbox's journal holds
    and the audit log missed (a kill between the two writes) is shown too."""
    ui = Ui()
    validate_name(name)
    records = as_shown(with_journal(workspace.audit().records(sandbox=name),
                                    workspace.journal(name).records(sandbox=name)))
    if not records and name not in {i.name for i in workspace.backend.list()}:
        raise SandboxNotFound(f"no sandbox named {name} and no history for it; see `hermes-sandboxes ls`")
    if not show_all:
        records = [r for r in records if not (isinstance(r, ExecRecord) and r.internal)]
    if as_json:
        ui.json([r.to_dict() for r in records])
        return
    if not records:
        ui.note(f"no recorded history for {name} yet")
        return
    triggers = {r.id: r.trigger for r in records if isinstance(r, CheckpointRecord)}
    rows = [[clock(r.ts), r.TYPE, *_describe(r, triggers)] for r in records]
    ui.table(["TIME", "EVENT", "EXIT", "TOOK", "DETAIL"], rows)


def _describe(r: Record, triggers: Mapping[str, str]) -> list[str]:
    """EXIT, TOOK and DETAIL cells for one record (``triggers``: each checkpoint's, by id)."""
    if isinstance(r, ExecRecord):
        detail = one_line(r.command, 80) + (f"  ({r.error})" if r.error else "")
        if r.origin.get("session"):  # the agent session that sent it (Hermes records carry it; --json too)
            detail += f"  [session {r.origin['session']}]"
        return [_exit_text(r.exit_code, r.timed_out, _ending(r.to_summary())), duration(r.duration_s), detail]
    if isinstance(r, CheckpointRecord):
        # an automatic checkpoint's comment already names its command; say it only when it does not
        told = r.comment or (f"before: {r.trigger_command}" if r.trigger_command else "")
        return ["", "", f"{r.id} [{r.trigger}] {one_line(told, 70)}".rstrip()]
    if isinstance(r, RestoreRecord):
        return ["", "", f"to {r.id}, discarding {r.discarded} command(s)" + (f" ({r.note})" if r.note else "")]
    if isinstance(r, RestoreStartRecord | CheckpointStartRecord):
        what = f"restore to {r.id}" if isinstance(r, RestoreStartRecord) else "checkpoint"
        state = "under way" if r.owner is not None and alive(r.owner) else "its process died before its end"
        return ["", "", f"{what}: {state}"]
    if isinstance(r, AbandonedRecord):
        return ["", "", one_line(r.reason, 100)]
    if isinstance(r, CheckpointNamedRecord):
        return ["", "", f"{r.id} named to the agent as its undo"]
    if isinstance(r, CheckpointDeleteRecord):
        kind = f" [{triggers[r.id]}]" if r.id in triggers else ""
        who = "by retention (older automatic checkpoints)" if r.reason == "retention" else "by hand (checkpoint rm)"
        return ["", "", f"{r.id}{kind} deleted {who}"]
    if isinstance(r, CreateRecord):
        fork = f", forked from {r.forked_from}" if r.forked_from else ""
        return ["", "", f"{r.backend or '?'} backend, {'ephemeral' if r.ephemeral else 'persistent'}{fork}"]
    if isinstance(r, ForkRecord):
        return ["", "", f"forked into {r.to}" + (f" from {r.checkpoint}" if r.checkpoint else " as it was")]
    if isinstance(r, EgressRecord):
        what = f"{r.verdict} {r.host}:{r.port}" + (f" x{r.count}" if r.count != 1 else "")
        if r.verdict == "allowed":
            return ["", "", f"{what} ({r.bytes_out} B out, {r.bytes_in} B in)"
                            + (f" with credential {r.credential}" if r.credential else "")]
        # the proxy's reason may repeat "refused HOST:PORT: " (its answer to the client): said once
        return ["", "", f"{what}: {one_line(r.reason.removeprefix(f'{what}: '), 60)}"]
    if isinstance(r, AllowRecord):
        return ["", "", one_line(_allow_change(r), 80)]
    if isinstance(r, StopRecord):
        after = f" after {duration(r.idle_timeout)} without a command" if r.idle_timeout else ""
        return ["", "", f"{r.reason} stop{after}: processes ended, files and checkpoints kept"]
    assert isinstance(r, DestroyRecord)
    return ["", "", ""]


def _allow_change(r: AllowRecord) -> str:
    """An allow-list change as what it added and removed (the whole list when the old one is unknown)."""
    if r.previous is None:
        return "allow-list now: " + (" ".join(r.allow) or "(empty)")
    added = [e for e in r.allow if e not in r.previous]
    removed = [e for e in r.previous if e not in r.allow]
    parts = [*(f"+{e}" for e in added), *(f"-{e}" for e in removed)]
    return "allow-list " + (" ".join(parts) if parts else "unchanged")
