"""Agent tools: the model checkpoints, lists, diffs and restores its own sandbox.

Each tool acts on the sandbox of the task that calls it (Hermes passes ``task_id``; the environment
is looked up, or brought up, the same way the terminal tool does it). Results are JSON the model can
act on: ids to pass back, and a sentence saying what happened and what to do next.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from hermes_sandboxes.errors import CheckpointNotFound, SandboxError
from hermes_sandboxes.hermes.environment import SandboxEnvironment
from hermes_sandboxes.hermes.providers.registry import active
from hermes_sandboxes.recorder.records import ExecRecord
from hermes_sandboxes.recorder.sandbox import RecordedSandbox, RestorePreview, StoriedCheckpoint
from hermes_sandboxes.sandbox import Capability

logger = logging.getLogger(__name__)

TOOLSET = "sandbox"
MAX_DIFF_ENTRIES = 200

Handler = Callable[..., str]


def _result(**fields: Any) -> str:
    return json.dumps(fields, ensure_ascii=False, default=str)


def _error(message: str) -> str:
    return json.dumps({"error": message}, ensure_ascii=False)


MAX_STORY_COMMANDS = 10
MAX_DISCARDED_COMMANDS = 20


def _environment(task_id: str | None) -> SandboxEnvironment:
    from tools.terminal_tool import ensure_task_env

    env = ensure_task_env(task_id or "default")
    if not isinstance(env, SandboxEnvironment):
        raise LookupError("the terminal backend is not one of the hermes-sandboxes backends "
                          "(terminal.backend: sandbox, sprites or e2b)")
    return env


def _checkpoint_view(cp: StoriedCheckpoint) -> dict[str, Any]:
    """A checkpoint and its story in the documented flat schema (``StoriedCheckpoint.to_dict``),
    with only the last few commands: the model needs the recent ones, not a long log."""
    view = cp.to_dict()
    view["created_at"] = round(cp.created_at, 3)
    commands = view["commands"]
    view["commands"] = [{"command": c["command"], "exit_code": c["exit_code"]} for c in commands[-MAX_STORY_COMMANDS:]]
    view.update(_omitted(commands, MAX_STORY_COMMANDS))
    return view


def _guarded(fn: Callable[[SandboxEnvironment, dict[str, Any]], str]) -> Handler:
    def handler(args: dict[str, Any], task_id: str | None = None, **_: Any) -> str:
        try:
            env = _environment(task_id)
            with env.busy():  # a cleanup asked for meanwhile waits for the tool
                return fn(env, args or {})
        except CheckpointNotFound as exc:  # the model cannot run the host's CLI: its own tool lists them
            return _error(f"{exc}; list them with the sandbox_checkpoints tool")
        except (SandboxError, LookupError) as exc:
            return _error(str(exc))

    handler.__name__ = fn.__name__
    return handler


def checkpoint_tool(env: SandboxEnvironment, args: dict[str, Any]) -> str:
    comment = str(args.get("comment") or "").strip()
    if not comment:
        return _error("give a comment saying what state this checkpoint captures")
    cp = env.recorded.checkpoint(comment, trigger="agent")
    return _result(
        checkpoint=cp.id, sandbox=env.sandbox_name, comment=comment,
        message=f"Saved checkpoint {cp.id}. To return to this state, call sandbox_restore with id {cp.id}.",
    )


def checkpoints_result(recorded: RecordedSandbox) -> dict[str, Any]:
    """The checkpoints' view, for the agent's tool and ``hermes sandbox checkpoints`` alike."""
    items = [_checkpoint_view(cp) for cp in recorded.checkpoints()]
    message = (f"{len(items)} checkpoint(s), oldest first." if items
               else "No checkpoints yet; call sandbox_checkpoint to save one.")
    note = recorded.retention_note
    return {"sandbox": recorded.name, "checkpoints": items, "message": message, **({"retention": note} if note else {})}


def checkpoints_tool(env: SandboxEnvironment, args: dict[str, Any]) -> str:
    return _result(**checkpoints_result(env.recorded))


def restore_result(recorded: RecordedSandbox, checkpoint_id: str,
                   discarded: Sequence[ExecRecord] | None) -> dict[str, Any]:
    """What a restore did, for the agent's tool and ``hermes sandbox restore`` alike."""
    undone = "" if discarded is None else f" The effects of {len(discarded)} command(s) since then are gone."
    commands = None if discarded is None else [r.command for r in discarded]
    return {
        "restored": checkpoint_id, "sandbox": recorded.name,
        "discarded_commands": None if commands is None else commands[-MAX_DISCARDED_COMMANDS:],
        **_omitted(commands, MAX_DISCARDED_COMMANDS),
        "message": (f"The sandbox's files are back at checkpoint {checkpoint_id}.{undone} Processes that were "
                    "running were stopped; start again any server you need."),
    }


def _omitted(items: Sequence[object] | None, shown: int) -> dict[str, int]:
    """``earlier_commands_omitted``, when a list of commands was cut to its last ``shown``."""
    return {"earlier_commands_omitted": len(items) - shown} if items is not None and len(items) > shown else {}


def restore_tool(env: SandboxEnvironment, args: dict[str, Any]) -> str:
    checkpoint_id = str(args.get("id") or "").strip()
    if not checkpoint_id:
        return _error("give the id of a checkpoint (see sandbox_checkpoints)")
    discarded = env.recorded.restore(checkpoint_id)
    env.after_restore()
    return _result(**restore_result(env.recorded, checkpoint_id, discarded))


def diff_tool(env: SandboxEnvironment, args: dict[str, Any]) -> str:
    checkpoint_id = str(args.get("id") or "").strip()
    if not checkpoint_id:
        return _error("give the id of a checkpoint (see sandbox_checkpoints)")
    backend = env.sandbox.backend
    if Capability.DIFF not in backend.capabilities:
        return _error(f"the {backend.name} backend cannot diff checkpoints; sandbox_checkpoints shows the "
                      "commands run since each checkpoint instead")
    preview = env.recorded.restore_preview(checkpoint_id)
    if preview.changes is None:
        return _error(f"no diff for checkpoint {checkpoint_id}: {preview.diff_unavailable}")
    return _result(**diff_result(env.recorded.name, checkpoint_id, preview))


def diff_result(sandbox: str, checkpoint_id: str, preview: RestorePreview) -> dict[str, Any]:
    """The files changed since a checkpoint (a preview with its diff), for the tool and the CLI alike."""
    changes = preview.changes or ()
    shown = [{"path": c.path, "change": str(c.kind), "size": c.size} for c in changes[:MAX_DIFF_ENTRIES]]
    message = f"{len(changes)} path(s) changed since checkpoint {checkpoint_id}."
    if len(changes) > len(shown):
        message += f" Showing the first {len(shown)}; the summary counts them all."
    commands = [{"command": r.command, "exit_code": r.exit_code} for r in (preview.commands or ())]
    return {"sandbox": sandbox, "since": checkpoint_id, "changes": shown,
            "summary": preview.summary.to_dict() if preview.summary else None,
            "commands": commands[-MAX_STORY_COMMANDS:], **_omitted(commands, MAX_STORY_COMMANDS),
            "message": message}


_ID = {"type": "string", "description": "a checkpoint id from sandbox_checkpoint or sandbox_checkpoints"}

TOOLS: tuple[tuple[str, str, dict[str, Any], Callable[[SandboxEnvironment, dict[str, Any]], str]], ...] = (
    ("sandbox_checkpoint",
     "Save a checkpoint of your sandbox's files (fast). Use it before anything you may want to undo.",
     {"type": "object", "properties": {"comment": {
         "type": "string", "description": "what state this captures, e.g. 'tests pass before refactor'"}},
      "required": ["comment"]},
     checkpoint_tool),
    ("sandbox_checkpoints",
     "List your sandbox's checkpoints, oldest first, each with its comment and what happened around it.",
     {"type": "object", "properties": {}},
     checkpoints_tool),
    ("sandbox_restore",
     "Roll your sandbox's files back to a checkpoint. Running processes are stopped.",
     {"type": "object", "properties": {"id": _ID}, "required": ["id"]},
     restore_tool),
    ("sandbox_diff",
     "List the files that changed in your sandbox since a checkpoint (added, modified, deleted).",
     {"type": "object", "properties": {"id": _ID}, "required": ["id"]},
     diff_tool),
)


def _available() -> bool:
    """The tools appear only when one of our providers is the active terminal backend."""
    return active() is not None


def register_tools(ctx: Any) -> None:
    for name, description, parameters, fn in TOOLS:
        schema = {"name": name, "description": description, "parameters": parameters}
        ctx.register_tool(
            name=name, toolset=TOOLSET, schema=schema, handler=_guarded(fn), check_fn=_available,
            description=description, emoji="🧷",
        )
