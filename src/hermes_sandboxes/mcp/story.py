"""The checkpoint tools: take one, list them with their story, show one, diff, the log of commands,
restore (preview first, applied only when confirmed) and fork.

Checkpoints are shown in the recorder's documented flat schema (``StoriedCheckpoint.to_dict``):
the same fields ``checkpoint list --json`` prints. A restore throws work away, so a call without
``confirm: true`` changes nothing and returns what the restore would discard (the files changed
since, where the backend can diff, and the commands run since): the model, or the user approving
the call, decides with that in front of them. Where a backend lacks a capability (no diff, no
fork, no checkpoint deletion) the result says so instead of failing silently.
"""

from __future__ import annotations

from hermes_sandboxes.mcp.commands import SANDBOX_ARG
from hermes_sandboxes.mcp.scope import Scope
from hermes_sandboxes.mcp.tools import READ_ONLY, Annotations, CallContext, Tool, ToolError, ToolResult

TYPE_CHECKING = False  # (typing.TYPE_CHECKING without importing typing: the server's start-up is measured)
if TYPE_CHECKING:
    from typing import Any

    from hermes_sandboxes.recorder.sandbox import RestorePreview, StoriedCheckpoint


MAX_CHANGES = 300
MAX_COMMANDS = 50


class Story:
    def __init__(self, scope: Scope) -> None:
        self.scope = scope

    def tools(self) -> list[Tool]:
        return [
            Tool("checkpoint_create", "Save a checkpoint", CREATE_DESCRIPTION, CREATE_SCHEMA,
                 Annotations(), self.create),
            Tool("checkpoint_list", "List checkpoints", LIST_DESCRIPTION, SANDBOX_ONLY, READ_ONLY, self.list),
            Tool("checkpoint_show", "Show one checkpoint", SHOW_DESCRIPTION, ID_SCHEMA, READ_ONLY, self.show),
            Tool("checkpoint_diff", "Files changed since a checkpoint", DIFF_DESCRIPTION, DIFF_SCHEMA,
                 READ_ONLY, self.diff),
            Tool("checkpoint_log", "Commands run in a sandbox", LOG_DESCRIPTION, LOG_SCHEMA, READ_ONLY, self.log),
            Tool("checkpoint_restore", "Roll a sandbox back to a checkpoint", RESTORE_DESCRIPTION, RESTORE_SCHEMA,
                 Annotations(destructive=True, idempotent=True), self.restore),
            Tool("sandbox_fork", "Copy a sandbox into a new one", FORK_DESCRIPTION, FORK_SCHEMA,
                 Annotations(), self.fork),
        ]

    def create(self, ctx: CallContext, args: dict[str, Any]) -> ToolResult:
        opened = self.scope.use(args.get("sandbox"))
        comment = str(args.get("comment") or "").strip()
        if not comment:
            raise ToolError("give a comment saying what state this checkpoint captures")
        cp = opened.recorded.checkpoint(comment, trigger="agent")
        name = opened.recorded.name
        return ToolResult.ok({
            "sandbox": name, "checkpoint": _view(cp),
            "message": f"Saved checkpoint {cp.id}. To return to this state, call checkpoint_restore with "
                       f"sandbox {name!r}, checkpoint {cp.id!r} and confirm true."})

    def list(self, ctx: CallContext, args: dict[str, Any]) -> ToolResult:
        opened = self.scope.use(args.get("sandbox"))
        items = [_view(cp) for cp in opened.recorded.checkpoints()]
        data: dict[str, Any] = {"sandbox": opened.recorded.name, "checkpoints": items,
                                "message": f"{len(items)} checkpoint(s), oldest first." if items
                                else "No checkpoints yet; checkpoint_create saves one."}
        if opened.recorded.retention_note:
            data["retention"] = opened.recorded.retention_note
        return ToolResult.ok(data)

    def show(self, ctx: CallContext, args: dict[str, Any]) -> ToolResult:
        opened = self.scope.use(args.get("sandbox"))
        cp = opened.recorded.get_checkpoint(str(args["checkpoint"]))
        return ToolResult.ok({"sandbox": opened.recorded.name, "checkpoint": cp.to_dict()})

    def diff(self, ctx: CallContext, args: dict[str, Any]) -> ToolResult:
        from hermes_sandboxes.recorder.diffsummary import summarize
        from hermes_sandboxes.sandbox import Capability

        opened = self.scope.use(args.get("sandbox"))
        sandbox = opened.recorded.inner
        backend = sandbox.backend
        if Capability.DIFF not in backend.capabilities:
            raise ToolError(f"the {backend.name} backend cannot diff checkpoints; checkpoint_log shows the "
                            "commands run since a checkpoint instead")
        since = str(args["checkpoint"])
        opened.recorded.get_checkpoint(since)  # CheckpointNotFound with the way to list them
        changes = sandbox.diff(since, args.get("to"))
        shown = [{"path": c.path, "change": str(c.kind), "size": c.size} for c in changes[:MAX_CHANGES]]
        message = f"{len(changes)} path(s) changed since checkpoint {since}."
        if len(changes) > len(shown):
            message += f" Showing the first {len(shown)}; the summary counts them all."
        return ToolResult.ok({"sandbox": opened.recorded.name, "since": since, "to": args.get("to"),
                              "changes": shown, "summary": summarize(changes).to_dict(), "message": message})

    def log(self, ctx: CallContext, args: dict[str, Any]) -> ToolResult:
        opened = self.scope.use(args.get("sandbox"))
        recorded = opened.recorded
        limit = int(args.get("limit") or MAX_COMMANDS)
        since = args.get("since")
        if since:
            preview = recorded.restore_preview(str(since), diff=False)
            commands = list(preview.commands or ())
        else:
            from hermes_sandboxes.recorder.records import ExecRecord
            from hermes_sandboxes.recorder.story import as_shown

            shown = as_shown(recorded.journal.records(sandbox=recorded.name))
            commands = [r for r in shown if isinstance(r, ExecRecord) and not r.internal]
        items = [c.to_summary() for c in commands[-limit:]]
        data: dict[str, Any] = {"sandbox": recorded.name, "since": since, "commands": items}
        if len(commands) > len(items):
            data["earlier_omitted"] = len(commands) - len(items)
        return ToolResult.ok(data)

    def restore(self, ctx: CallContext, args: dict[str, Any]) -> ToolResult:
        opened = self.scope.use(args.get("sandbox"))
        recorded = opened.recorded
        checkpoint = str(args["checkpoint"])
        if args.get("confirm") is not True:
            preview = recorded.restore_preview(checkpoint)
            return ToolResult.ok(_preview(preview, recorded.name))
        with opened.lock:
            discarded = recorded.restore(checkpoint)
        gone = "" if discarded is None else f" The effects of {len(discarded)} command(s) since then are gone."
        return ToolResult.ok({
            "sandbox": recorded.name, "restored": checkpoint, "applied": True,
            "discarded_commands": None if discarded is None else [r.command for r in discarded][-20:],
            "message": (f"Sandbox {recorded.name}'s files are back at checkpoint {checkpoint}.{gone} Processes "
                        "that were running were stopped; start again any server you need.")})

    def fork(self, ctx: CallContext, args: dict[str, Any]) -> ToolResult:
        from hermes_sandboxes.errors import Unsupported
        from hermes_sandboxes.sandbox import Capability

        opened = self.scope.use(args.get("sandbox"))
        source = opened.recorded.inner
        if Capability.FORK not in source.backend.capabilities:
            raise Unsupported(f"the {source.backend.name} backend cannot fork sandboxes; nothing was changed")
        if self.scope.rules.pinned is not None:
            raise ToolError(f"this server serves only sandbox {self.scope.rules.pinned}; it creates no others")
        new = self.scope.full_name(str(args["name"]))
        checkpoint = args.get("checkpoint")
        forked = source.fork(new, checkpoint)
        self.scope.forked(forked, source.name if checkpoint is None else f"{source.name}@{checkpoint}")
        return ToolResult.ok({"sandbox": new, "forked_from": source.name, "checkpoint": checkpoint,
                              "message": f"Created sandbox {new} from {source.name}"
                                         + (f" at checkpoint {checkpoint}." if checkpoint else " as it is now.")})


def _view(cp: StoriedCheckpoint) -> dict[str, Any]:
    """The flat schema, with only the last commands of its story (the model needs the recent ones)."""
    view = cp.to_dict()
    commands = view["commands"]
    view["commands"] = commands[-10:]
    if len(commands) > 10:
        view["earlier_commands_omitted"] = len(commands) - 10
    return view


def _preview(preview: RestorePreview, name: str) -> dict[str, Any]:
    data = preview.to_dict()
    cp = preview.checkpoint
    commands = data["commands"]
    if commands is not None and len(commands) > MAX_COMMANDS:
        data["commands"] = commands[-MAX_COMMANDS:]
        data["earlier_commands_omitted"] = len(commands) - MAX_COMMANDS
    if preview.changes is not None:
        data["changes"] = [{"path": c.path, "change": str(c.kind)} for c in preview.changes[:MAX_CHANGES]]
    lost = [] if commands is None else [c["command"] for c in commands]
    files = (f"{len(preview.changes)} changed path(s)" if preview.changes is not None
             else f"the changed files (no diff: {preview.diff_unavailable})")
    data.update({
        "sandbox": name, "applied": False,
        "message": (f"Nothing was changed yet. Restoring checkpoint {cp.id} would throw away {files} and the "
                    f"effects of {'an unknown number of' if commands is None else len(lost)} command(s) run since "
                    f"it. To do it, call checkpoint_restore again with confirm true.")})
    return data


SANDBOX_ONLY: dict[str, Any] = {"type": "object", "properties": {"sandbox": SANDBOX_ARG},
                                "additionalProperties": False}
_CHECKPOINT = {"type": "string", "description": "a checkpoint id, from checkpoint_list or an exec result"}
ID_SCHEMA: dict[str, Any] = {"type": "object", "properties": {"sandbox": SANDBOX_ARG, "checkpoint": _CHECKPOINT},
                             "required": ["checkpoint"], "additionalProperties": False}

CREATE_DESCRIPTION = ("Save a checkpoint of a sandbox's files (fast). Take one before work you may want to undo; "
                      "checkpoint_restore returns to it.")
CREATE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"sandbox": SANDBOX_ARG, "comment": {
        "type": "string", "minLength": 1,
        "description": "what state this captures, e.g. 'tests pass before refactor'"}},
    "required": ["comment"], "additionalProperties": False,
}
LIST_DESCRIPTION = ("List a sandbox's checkpoints, oldest first, each with why it was taken (manual, agent, or auto "
                    "before a risky command) and the commands run before it.")
SHOW_DESCRIPTION = "Show one checkpoint with its whole story (every command run between it and the one before)."
DIFF_DESCRIPTION = "List the files added, modified or deleted in a sandbox since a checkpoint (or between two)."
DIFF_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"sandbox": SANDBOX_ARG, "checkpoint": _CHECKPOINT,
                   "to": {"type": "string", "description": "a later checkpoint (default: the files now)"}},
    "required": ["checkpoint"], "additionalProperties": False,
}
LOG_DESCRIPTION = ("The commands run in a sandbox with their exit codes, oldest first: all of them, or those since "
                   "a checkpoint (what restoring it would undo).")
LOG_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"sandbox": SANDBOX_ARG,
                   "since": {"type": "string", "description": "a checkpoint id: only the commands after it"},
                   "limit": {"type": "integer", "minimum": 1, "maximum": 1000,
                             "description": f"the last N commands (default {MAX_COMMANDS})"}},
    "additionalProperties": False,
}
RESTORE_DESCRIPTION = (
    "Roll a sandbox's files back to a checkpoint, undoing every command since (running processes are "
    "stopped). Without confirm it changes nothing and returns a preview: the files and commands that would "
    "be thrown away. Call it with confirm true to restore. After a risky exec, its result names the "
    "checkpoint to give here.")
RESTORE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"sandbox": SANDBOX_ARG, "checkpoint": _CHECKPOINT,
                   "confirm": {"type": "boolean", "description": "true to apply; false or absent: preview only"}},
    "required": ["checkpoint"], "additionalProperties": False,
}
FORK_DESCRIPTION = ("Create a new sandbox with the files of this one (now, or at a checkpoint); both then run "
                    "independently. Use it to try something risky on a copy.")
FORK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"sandbox": SANDBOX_ARG, "name": {"type": "string", "description": "the new sandbox's name"},
                   "checkpoint": {"type": "string", "description": "copy this checkpoint instead of the files now"}},
    "required": ["name"], "additionalProperties": False,
}
