"""The file tools: read, write and list files inside a sandbox, by absolute path.

Reads and writes go through the backend's own file calls (binary-safe: text comes back as text
when it is UTF-8, else as base64, and a write takes either), each capped in size so a stray call
cannot fill the model's context or the sandbox. A listing runs ``find`` inside the sandbox (the
contract has no directory call); like a read it changes nothing and is not journaled.
"""

from __future__ import annotations

import base64

from hermes_sandboxes.mcp.commands import SANDBOX_ARG
from hermes_sandboxes.mcp.scope import Scope, check_path
from hermes_sandboxes.mcp.tools import READ_ONLY, Annotations, CallContext, Tool, ToolError, ToolResult

TYPE_CHECKING = False  # (typing.TYPE_CHECKING without importing typing: the server's start-up is measured)
if TYPE_CHECKING:
    from typing import Any

DEFAULT_READ_BYTES = 256 * 1024
MAX_READ_BYTES = 8 * 2**20
MAX_WRITE_BYTES = 8 * 2**20
MAX_LIST_ENTRIES = 1000
_KINDS = {"f": "file", "d": "directory", "l": "symlink", "p": "fifo", "s": "socket", "c": "char-device",
          "b": "block-device"}


class Files:
    def __init__(self, scope: Scope) -> None:
        self.scope = scope

    def tools(self) -> list[Tool]:
        return [
            Tool("file_read", "Read a file in a sandbox", READ_DESCRIPTION, READ_SCHEMA, READ_ONLY, self.read),
            Tool("file_write", "Write a file in a sandbox", WRITE_DESCRIPTION, WRITE_SCHEMA,
                 Annotations(destructive=True, idempotent=True), self.write),
            Tool("file_list", "List a directory in a sandbox", LIST_DESCRIPTION, LIST_SCHEMA, READ_ONLY, self.list),
        ]

    def read(self, ctx: CallContext, args: dict[str, Any]) -> ToolResult:
        opened = self.scope.use(args.get("sandbox"))
        path = check_path(args["path"])
        cap = int(args.get("max_bytes") or DEFAULT_READ_BYTES)
        size = _size(opened.recorded.inner, path)
        if size is not None and size > cap:
            raise ToolError(f"{path} is {size} bytes, more than the {cap} this call returns; raise max_bytes "
                            f"(up to {MAX_READ_BYTES}) or read a part with exec (head -c, tail -c, sed -n)")
        data = opened.recorded.inner.read_file(path)
        if len(data) > cap:  # it grew since, or the size was unknown
            raise ToolError(f"{path} is {len(data)} bytes, more than the {cap} this call returns")
        encoding = args.get("encoding") or "auto"
        text: str | None = None
        if encoding != "base64":
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                if encoding == "text":
                    raise ToolError(f"{path} is not UTF-8 text; read it with encoding 'base64'") from None
        name = opened.recorded.name
        if text is not None:
            shown = opened.redactor.redact(text)
            return ToolResult.ok({"sandbox": name, "path": path, "size": len(data), "encoding": "text",
                                  "content": shown}, shown)
        encoded = base64.b64encode(data).decode()
        return ToolResult.ok({"sandbox": name, "path": path, "size": len(data), "encoding": "base64",
                              "content": encoded},
                             f"[{path}: {len(data)} bytes of binary data, base64]\n{encoded}")

    def write(self, ctx: CallContext, args: dict[str, Any]) -> ToolResult:
        opened = self.scope.use(args.get("sandbox"))
        path = check_path(args["path"])
        if (args.get("content") is None) == (args.get("content_base64") is None):
            raise ToolError("give exactly one of content (text) or content_base64 (bytes)")
        if args.get("content_base64") is not None:
            try:
                data = base64.b64decode(args["content_base64"], validate=True)
            except ValueError as exc:
                raise ToolError(f"content_base64 is not base64: {exc}") from None
        else:
            data = str(args["content"]).encode()
        if len(data) > MAX_WRITE_BYTES:
            raise ToolError(f"the content is {len(data)} bytes; file_write takes at most {MAX_WRITE_BYTES} "
                            "(split it, or produce the file with exec)")
        mode = int(str(args.get("mode") or "644"), 8)
        opened.recorded.inner.write_file(path, data, mode)
        return ToolResult.ok({"sandbox": opened.recorded.name, "path": path, "size": len(data),
                              "mode": f"{mode:o}"},
                             f"wrote {len(data)} bytes to {path} in sandbox {opened.recorded.name}")

    def list(self, ctx: CallContext, args: dict[str, Any]) -> ToolResult:
        opened = self.scope.use(args.get("sandbox"))
        path = check_path(args.get("path") or opened.recorded.inner.home)
        depth = int(args.get("depth") or 1)
        result = opened.recorded.inner.exec(
            ["find", path, "-mindepth", "1", "-maxdepth", str(depth), "-printf", r"%y\t%s\t%P\0"], timeout=60,
            capture_limit=4 * 2**20)
        if result.exit_code != 0 and not result.stdout:
            raise ToolError(f"cannot list {path}: {result.stderr.strip() or f'find exited {result.exit_code}'}")
        entries = []
        for item in sorted(filter(None, result.stdout.split("\0")), key=lambda i: i.split("\t", 2)[-1]):
            kind, size, name = item.split("\t", 2)
            entries.append({"name": name, "type": _KINDS.get(kind, kind), "size": int(size)})
        shown = entries[:MAX_LIST_ENTRIES]
        lines = [f"{e['name']}{'/' if e['type'] == 'directory' else ''}\t{e['size']}" for e in shown]
        more = len(entries) - len(shown)
        if more:
            lines.append(f"[{more} more entries not shown; list a subdirectory or use exec]")
        return ToolResult.ok({"sandbox": opened.recorded.name, "path": path, "entries": shown,
                              "omitted": more}, "\n".join(lines) or f"{path} is empty")


def _size(sandbox: Any, path: str) -> int | None:
    """The file's size, read without reading it (None if the sandbox cannot say)."""
    from hermes_sandboxes.errors import SandboxFileNotFound

    result = sandbox.exec(["stat", "-L", "-c", "%s %F", "--", path], timeout=30)
    if result.exit_code != 0:
        if "No such file" in result.stderr:
            raise SandboxFileNotFound(f"no file {path} in sandbox {sandbox.name}")
        return None
    size, _, kind = result.stdout.strip().partition(" ")
    if kind == "directory":
        raise ToolError(f"{path} is a directory; list it with file_list")
    return int(size) if size.isdigit() else None


_PATH = {"type": "string", "description": "absolute path inside the sandbox, e.g. /root/app/main.py"}

READ_DESCRIPTION = ("Read a file from a sandbox. UTF-8 text comes back as text, anything else as base64. "
                    f"Files above max_bytes (default {DEFAULT_READ_BYTES}) are refused with their size.")
READ_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "sandbox": SANDBOX_ARG, "path": _PATH,
        "encoding": {"type": "string", "enum": ["auto", "text", "base64"],
                     "description": "auto (default): text if UTF-8, else base64"},
        "max_bytes": {"type": "integer", "minimum": 1, "maximum": MAX_READ_BYTES},
    },
    "required": ["path"], "additionalProperties": False,
}
WRITE_DESCRIPTION = ("Create or replace a file in a sandbox (missing parent directories are made). Give the "
                     f"text as content, or bytes as content_base64; at most {MAX_WRITE_BYTES} bytes.")
WRITE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "sandbox": SANDBOX_ARG, "path": _PATH,
        "content": {"type": "string", "description": "the file's whole new text"},
        "content_base64": {"type": "string", "description": "the file's bytes, base64-encoded"},
        "mode": {"type": "string", "pattern": "^[0-7]{3,4}$", "description": "octal permissions (default 644)"},
    },
    "required": ["path"], "additionalProperties": False,
}
LIST_DESCRIPTION = "List a directory in a sandbox: names, types and sizes (depth 1 by default)."
LIST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "sandbox": SANDBOX_ARG,
        "path": {"type": "string", "description": "absolute directory path (default: the home directory)"},
        "depth": {"type": "integer", "minimum": 1, "maximum": 10, "description": "levels to descend (default 1)"},
    },
    "additionalProperties": False,
}
