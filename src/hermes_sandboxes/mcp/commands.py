"""The ``exec`` tool: one command in a sandbox, the recorded way, and what the model is told.

The command goes through the recorder's one path (``RecordedSandbox.start``), as the CLI's and
Hermes's do: per-command credentials, the automatic checkpoint before a risky command (fail
closed: if it cannot be taken, the command does not run), the record written ahead, the journal
and the audit log. The server waits for it in short slices, sending a progress notification each
second when the client asked for them, and ends it on one of:

- its own exit: the exit code;
- its timeout: it is killed with everything it started (where the backend kills trees) and ends
  with exit code 124, as ``timeout(1)`` and the CLI do;
- the client's cancellation (or the session's end): killed the same way and recorded as
  interrupted; the client gets no response, as the protocol says.

The result names the automatic checkpoint taken before the command and the exact call that undoes
it; retention keeps a checkpoint so named (``RecordedSandbox.promise``).
"""

from __future__ import annotations

import json
import time

from hermes_sandboxes.mcp.output import Spools, StreamCapture
from hermes_sandboxes.mcp.scope import Scope, check_path
from hermes_sandboxes.mcp.tools import Annotations, CallContext, Tool, ToolError, ToolResult

TYPE_CHECKING = False  # (typing.TYPE_CHECKING without importing typing: the server's start-up is measured)
if TYPE_CHECKING:
    from typing import Any

    from hermes_sandboxes.mcp.scope import OpenSandbox
    from hermes_sandboxes.recorder.command import RecordedProcess
    from hermes_sandboxes.recorder.sandbox import StoriedCheckpoint
    from hermes_sandboxes.risk import CheckpointPolicy

DEFAULT_TIMEOUT_S = 600.0
MAX_TIMEOUT_S = 86400.0
DEFAULT_OUTPUT_CHARS = 20_000  # of each stream, head and tail together
MAX_STDIN_BYTES = 8 * 2**20
PROGRESS_EVERY_S = 1.0
WAIT_SLICE_S = 0.2
RESTORE_TOOL = "checkpoint_restore"

SANDBOX_ARG = {"type": "string", "description": "the sandbox's name, as sandbox_create or sandbox_list gave it"}


class Commands:
    def __init__(self, scope: Scope, spools: Spools) -> None:
        self.scope = scope
        self.spools = spools

    def tools(self) -> list[Tool]:
        return [
            Tool("exec", "Run a command in a sandbox", EXEC_DESCRIPTION, EXEC_SCHEMA,
                 Annotations(destructive=True, open_world=False), self.exec),
            Tool("exec_output", "Read a command's full output", OUTPUT_DESCRIPTION, OUTPUT_SCHEMA,
                 Annotations(read_only=True, idempotent=True), self.output),
        ]

    # -- exec ----------------------------------------------------------------------------------

    def exec(self, ctx: CallContext, args: dict[str, Any]) -> ToolResult:
        from hermes_sandboxes.sandbox import TIMEOUT_EXIT_CODE, Capability

        opened = self.scope.use(args.get("sandbox"))
        command = _command(args["command"])
        cwd = check_path(args["cwd"], "cwd") if args.get("cwd") is not None else None
        env = _env(args.get("env") or {})
        stdin = _stdin(args)
        timeout = float(args.get("timeout") or DEFAULT_TIMEOUT_S)
        budget = int(args.get("max_output") or DEFAULT_OUTPUT_CHARS)
        policy: CheckpointPolicy | None = "always" if args.get("checkpoint") == "always" else None
        import os

        exec_id = os.urandom(6).hex()
        out = StreamCapture(budget, self.spools.opener(exec_id, "stdout"))
        err = StreamCapture(budget, self.spools.opener(exec_id, "stderr"))
        recorded = opened.recorded
        for name, value in env.items():
            if len(value) >= 8:  # as the CLI's --env: long values stay out of the journal and the output
                opened.redactor.add(name, value)
        if ctx.cancelled is not None:
            raise ToolError("cancelled before it started")
        recorded.inner.reserve(timeout)  # a leased sandbox (E2B) must outlive the command
        started = time.monotonic()
        fresh: list[bool] = []  # whether the automatic checkpoint was taken for this command (or reused)
        proc = recorded.start(command, checkpoint=policy, cwd=cwd, env=env, stdin=stdin,
                              origin=_origin(ctx), on_stdout=out.write, on_stderr=err.write,
                              on_checkpoint=lambda checkpoint, verdict, new: fresh.append(new))
        cancelled: list[str] = []

        def cancel(reason: str) -> None:
            cancelled.append(reason)
            proc.kill()

        ctx.on_cancel(cancel)
        try:
            code = _wait(ctx, proc, timeout, started, out, err)
        except BaseException:
            proc.stop("interrupted: the MCP server's wait failed")
            raise
        finally:
            out.close()
            err.close()
        if cancelled:
            proc.stop(f"interrupted: the MCP client cancelled the call ({cancelled[0]})")
            return ToolResult.failure("cancelled by the client; the command was killed")
        timed_out = code is None
        if code is None:
            proc.stop(None, timed_out=True)
            code = TIMEOUT_EXIT_CODE
        else:
            proc.finish(code)
        tree = Capability.TREE_KILL in recorded.inner.backend.capabilities
        return self._result(opened, proc, all(fresh), code, timed_out, time.monotonic() - started,
                            out, err, exec_id, tree)

    def _result(self, opened: OpenSandbox, proc: RecordedProcess, fresh: bool, code: int, timed_out: bool,
                duration: float, out: StreamCapture, err: StreamCapture, exec_id: str, tree: bool) -> ToolResult:
        redact = opened.redactor.redact
        name = opened.recorded.name
        data: dict[str, Any] = {
            "sandbox": name, "exit_code": code, "timed_out": timed_out, "duration_s": round(duration, 3),
            "stdout": redact(out.text()), "stderr": redact(err.text()),
            "stdout_bytes": out.total, "stderr_bytes": err.total,
            "cut_bytes": {"stdout": max(0, out.cut), "stderr": max(0, err.cut)},
            "output_id": exec_id if self.spools.kept(exec_id) else None,
            "checkpoint": None,
        }
        notes: list[str] = []
        if timed_out:
            what = ("it and every process it started were killed" if tree
                    else "it was killed; processes it started in the background may still run")
            notes.append(f"timed out: {what} (exit code 124)")
        if proc.out_of_memory:
            notes.append("killed for memory: the command reached the sandbox's memory limit (exit code 137)")
        if out.cut > 0 or err.cut > 0:
            notes.append(f"output was cut in the middle; exec_output with output_id {exec_id} reads all of it")
        taken = proc.auto_checkpoint
        if taken is not None:
            data["checkpoint"] = self._named(opened, taken, proc, fresh, notes)
        plan_note = proc.credentials.note()
        if plan_note:
            notes.append(plan_note.strip("[]").removeprefix("sandbox: "))
        data["notes"] = notes
        return ToolResult.ok(data, _text(data, notes))

    def _named(self, opened: OpenSandbox, taken: StoriedCheckpoint, proc: RecordedProcess, fresh: bool,
               notes: list[str]) -> dict[str, Any]:
        """The automatic checkpoint as the model is told it, with the call that undoes the command."""
        recorded = opened.recorded
        recorded.promise(taken.id)  # retention keeps the checkpoint named to the model
        reasons = list(proc.verdict.reasons)
        undo = {"tool": RESTORE_TOOL, "arguments": {"sandbox": recorded.name, "checkpoint": taken.id,
                                                    "confirm": True}}
        why = f" ({', '.join(reasons)})" if reasons else ""
        when = "was taken before this command" if fresh else "is the undo point (nothing changed since it was taken)"
        notes.append(f"checkpoint {taken.id} {when}{why}; to undo the command, call {RESTORE_TOOL} with "
                     f"{json.dumps(undo['arguments'])}")
        for lost in recorded.broken_promises:
            notes.append(f"checkpoint {lost}, named to you earlier, was deleted by checkpoint retention "
                         "and can no longer be restored")
        return {"id": taken.id, "fresh": fresh, "reasons": reasons, "undo": undo}

    # -- exec_output ---------------------------------------------------------------------------

    def output(self, ctx: CallContext, args: dict[str, Any]) -> ToolResult:
        stream = args.get("stream") or "stdout"
        offset = int(args.get("offset") or 0)
        length = int(args.get("length") or 100_000)
        found = self.spools.read(str(args["output_id"]), stream, offset, length)
        if found is None:
            raise ToolError(f"no output {args['output_id']!r} kept (this server keeps the last commands' only)")
        data, size = found
        text = data.decode("utf-8", "replace")
        end = offset + len(data)
        result = {"output_id": args["output_id"], "stream": stream, "offset": offset, "end": end,
                  "size": size, "more": end < size, "text": text}
        more = f"[{stream} bytes {offset}-{end} of {size}" + ("; more: call again with offset "
                                                               f"{end}]" if end < size else "]")
        return ToolResult.ok(result, f"{text}\n{more}")


def _origin(ctx: CallContext) -> dict[str, str]:
    """The journal's tags of this command: the MCP session, and the client that said its name."""
    origin = {"session": ctx.session_id}
    client = ctx.session.client.get("name")
    if isinstance(client, str) and client:
        origin["client"] = client[:64]
    return origin


def _text(data: dict[str, Any], notes: list[str]) -> str:
    """What the model reads: the exit code, each stream, then our notes."""
    parts = [f"exit code {data['exit_code']} ({data['duration_s']}s) in sandbox {data['sandbox']}"]
    for stream in ("stdout", "stderr"):
        if data[stream]:
            parts.append(f"--- {stream} ---\n{data[stream].rstrip()}")
    parts += [f"[sandbox: {note}]" for note in notes]
    return "\n".join(parts)


def _wait(ctx: CallContext, proc: RecordedProcess, timeout: float, started: float,
          out: StreamCapture, err: StreamCapture) -> int | None:
    """The exit code, or None at the deadline; progress sent about once a second."""
    deadline = started + timeout
    next_progress = started + PROGRESS_EVERY_S
    while True:
        now = time.monotonic()
        code = proc.wait(max(0.0, min(WAIT_SLICE_S, deadline - now, next_progress - now)), record=False)
        if code is not None:
            return code
        now = time.monotonic()
        if now >= deadline:
            return None
        if now >= next_progress:
            last = out.last_line() or err.last_line()
            ctx.progress(f"running for {now - started:.0f}s" + (f"; last output: {last}" if last else ""))
            next_progress = now + PROGRESS_EVERY_S


def _command(value: Any) -> str | list[str]:
    if isinstance(value, str):
        if not value.strip():
            raise ToolError("command is empty")
        return value
    if not value:
        raise ToolError("command is an empty list; give an argv such as [\"ls\", \"-la\"] or a shell line")
    return [str(v) for v in value]


def _env(env: dict[str, Any]) -> dict[str, str]:
    for key in env:
        if not key or not key.replace("_", "a").isalnum() or key[0].isdigit():
            raise ToolError(f"env name {key!r} is not a shell-style variable name")
    return {k: str(v) for k, v in env.items()}


def _stdin(args: dict[str, Any]) -> bytes | None:
    if args.get("stdin") is not None and args.get("stdin_base64") is not None:
        raise ToolError("give stdin or stdin_base64, not both")
    if args.get("stdin_base64") is not None:
        import base64

        try:
            data = base64.b64decode(args["stdin_base64"], validate=True)
        except ValueError as exc:
            raise ToolError(f"stdin_base64 is not base64: {exc}") from None
    elif args.get("stdin") is not None:
        data = str(args["stdin"]).encode()
    else:
        return None
    if len(data) > MAX_STDIN_BYTES:
        raise ToolError(f"stdin is {len(data)} bytes; at most {MAX_STDIN_BYTES} are taken (write a file instead)")
    return data


EXEC_DESCRIPTION = (
    "Run a command inside a sandbox (an isolated machine with its own files; nothing runs on the user's "
    "computer). Use this instead of a local shell for every command. A string is run by bash -c (pipes, "
    "&&, redirects work); a list is an argv run as is. Returns the exit code (124 if it hit the timeout, "
    "which kills it and everything it started), stdout and stderr (long output keeps its beginning and "
    "end; exec_output reads all of it). Before a risky command (rm -rf, git reset --hard, overwriting "
    "files, ...) a checkpoint is taken automatically and the result names it with the exact "
    f"{RESTORE_TOOL} call that undoes the command. Background processes keep running between calls.")

EXEC_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "sandbox": SANDBOX_ARG,
        "command": {"type": ["string", "array"], "items": {"type": "string"}, "minItems": 1,
                    "description": "a shell command line, e.g. 'cd /root/app && make test', or an argv list"},
        "cwd": {"type": "string", "description": "absolute working directory inside the sandbox (default: home)"},
        "env": {"type": "object", "additionalProperties": {"type": "string"},
                "description": "extra environment variables for this command"},
        "timeout": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_TIMEOUT_S,
                    "description": f"seconds before the command is killed (default {DEFAULT_TIMEOUT_S:g})"},
        "stdin": {"type": "string", "description": "text to feed the command on stdin"},
        "stdin_base64": {"type": "string", "description": "bytes to feed on stdin, base64-encoded"},
        "max_output": {"type": "integer", "minimum": 200, "maximum": 1_000_000,
                       "description": f"bytes of each stream returned (default {DEFAULT_OUTPUT_CHARS})"},
        "checkpoint": {"type": "string", "enum": ["auto", "always"],
                       "description": "auto: checkpoint first only if the command looks risky (default); "
                                      "always: checkpoint first whatever the command"},
    },
    "required": ["command"],
    "additionalProperties": False,
}

OUTPUT_DESCRIPTION = ("Read the full stdout or stderr of a recent exec whose output was cut, in pages. "
                      "Give the output_id from the exec result.")

OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "output_id": {"type": "string", "description": "output_id from an exec result"},
        "stream": {"type": "string", "enum": ["stdout", "stderr"], "description": "which stream (default stdout)"},
        "offset": {"type": "integer", "minimum": 0, "description": "byte to start at (default 0)"},
        "length": {"type": "integer", "minimum": 1, "maximum": 1_000_000,
                   "description": "bytes to read (default 100000)"},
    },
    "required": ["output_id"],
    "additionalProperties": False,
}
