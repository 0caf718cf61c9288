"""Tools as the server offers them: a name, a description written for a model, an input schema,
annotations that are true, and a handler; and the result a handler returns.

A result carries the same facts twice: as ``structuredContent`` (a JSON object for programs) and
as text for the model (most clients show the model only the text). A handler reports a failure by
raising ``ToolError`` or any ``SandboxError`` (whose messages already say what to do next): the
client gets a result with ``isError``, so the model can read it and correct itself.
"""

from __future__ import annotations

import json

from hermes_sandboxes.errors import CheckpointNotFound, SandboxError
from hermes_sandboxes.mcp import schema
from hermes_sandboxes.util.values import dataclass

TYPE_CHECKING = False  # (typing.TYPE_CHECKING without importing typing: the server's start-up is measured)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any

    from hermes_sandboxes.mcp.protocol import Call, Session


class ToolError(Exception):
    """A tool failed in a way the model should read (bad arguments, nothing to act on)."""


@dataclass(frozen=True)
class Annotations:
    """MCP tool annotations: hints a client shows its user or uses to decide what to ask about."""

    read_only: bool = False  # changes nothing anywhere
    destructive: bool = False  # may delete or overwrite what the model or the user made
    idempotent: bool = False  # calling it twice with the same arguments does no more than once
    open_world: bool = False  # reaches beyond the sandboxes (the network, the host)

    def to_wire(self, title: str) -> dict[str, Any]:
        return {"title": title, "readOnlyHint": self.read_only, "destructiveHint": self.destructive,
                "idempotentHint": self.idempotent, "openWorldHint": self.open_world}


READ_ONLY = Annotations(read_only=True, idempotent=True)


@dataclass(frozen=True)
class ToolResult:
    text: str
    data: dict[str, Any] | None = None
    is_error: bool = False

    @classmethod
    def ok(cls, data: dict[str, Any], text: str | None = None) -> ToolResult:
        """``data`` for programs; for the model ``text``, or ``data`` as compact JSON."""
        return cls(text if text is not None else _json(data), data)

    @classmethod
    def failure(cls, message: str, **data: Any) -> ToolResult:
        return cls(f"error: {message}", {"error": message, **data}, is_error=True)

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"content": [{"type": "text", "text": self.text}], "isError": self.is_error}
        if self.data is not None:
            wire["structuredContent"] = self.data
        return wire


def _json(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, default=str)


class CallContext:
    """What a handler may use of the call it serves: which session asked, whether the client
    cancelled, and a way to send progress."""

    def __init__(self, session: Session, call: Call) -> None:
        self.session = session
        self.call = call

    @property
    def session_id(self) -> str:
        return self.session.id

    def progress(self, message: str) -> None:
        self.call.progress(message)

    def on_cancel(self, hook: Callable[[str], None]) -> None:
        self.call.on_cancel(hook)

    @property
    def cancelled(self) -> str | None:
        return self.call.cancelled


if TYPE_CHECKING:
    Handler = Callable[[CallContext, dict[str, Any]], ToolResult]


@dataclass(frozen=True)
class Tool:
    name: str
    title: str
    description: str
    input_schema: dict[str, Any]
    annotations: Annotations
    handler: Handler

    def listing(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title, "description": self.description,
                "inputSchema": self.input_schema, "annotations": self.annotations.to_wire(self.title)}

    def run(self, ctx: CallContext, arguments: Any) -> ToolResult:
        """The handler's result for ``arguments`` checked against the schema; a failure the model
        should read (bad arguments, a SandboxError) as an error result."""
        if arguments is None:
            arguments = {}
        problems = schema.errors(self.input_schema, arguments)
        if problems:
            return ToolResult.failure(f"invalid arguments for {self.name}: " + "; ".join(problems))
        try:
            return self.handler(ctx, arguments)
        except CheckpointNotFound as exc:  # (the recorder names no face's way to list them)
            return ToolResult.failure(f"{exc}; list them with the checkpoint_list tool", kind=type(exc).__name__)
        except (ToolError, SandboxError) as exc:
            return ToolResult.failure(str(exc), kind=type(exc).__name__)


class Catalog:
    """The tools one server offers, in the order it lists them."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            self.add(tool)

    def add(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name} is defined twice")
        self._tools[tool.name] = tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return list(self._tools)

    def listing(self) -> list[dict[str, Any]]:
        return [tool.listing() for tool in self._tools.values()]
