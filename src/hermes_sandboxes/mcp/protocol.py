"""The Model Context Protocol's server side over JSON-RPC 2.0, independent of the transport.

A ``Session`` is one client's conversation: the transport hands it every message it reads
(``receive``) and a function that writes one message back (``send``). It answers ``initialize``,
``ping``, ``tools/list`` and ``tools/call``, and takes the client's notifications
(``initialized``, ``cancelled``). Each tool call runs on a thread of its own, so a long command
never holds up the next request, a ``ping`` or the cancellation of that very command.

This is written by hand on the standard library rather than with the official SDK on purpose: a
client spawns the server and waits a few seconds at most for ``initialize`` (Claude Code about 5 s),
and importing the SDK's server alone takes seconds on a busy small machine (see docs/mcp.md). Here
``initialize`` is answered before any backend, pydantic or SDK is imported. The protocol subset is
small and stable: requests, responses, notifications, progress and cancellation.

A tool error (bad arguments, an unknown sandbox, a failed command) is a successful response whose
result says ``isError``: the model reads it and can correct itself. Only what is wrong at the
protocol level (an unknown method or tool, a malformed request) is a JSON-RPC error. Nothing a
client sends can end the server: an exception in a tool becomes a tool error.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading

from hermes_sandboxes.mcp.tools import CallContext, ToolError, ToolResult

TYPE_CHECKING = False  # (typing.TYPE_CHECKING without importing typing: the server's start-up is measured)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    from hermes_sandboxes.mcp.tools import Catalog

# newest first; a client asking for one of these gets it, any other gets the newest
PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

if TYPE_CHECKING:
    Message = dict[str, Any]
    Send = Callable[[Message], None]


class Call:
    """One ``tools/call`` in flight: its cancellation and its progress notifications."""

    def __init__(self, request_id: Any, progress_token: Any, send: Send) -> None:
        self.request_id = request_id
        self.progress_token = progress_token
        self._send = send
        self._lock = threading.Lock()
        self._on_cancel: list[Callable[[str], None]] = []
        self.cancelled: str | None = None  # the client's reason, once it cancelled
        self.done = threading.Event()
        self._progress = 0.0

    def cancel(self, reason: str) -> None:
        with self._lock:
            if self.cancelled is not None or self.done.is_set():
                return
            self.cancelled = reason
            hooks = list(self._on_cancel)
        for hook in hooks:
            hook(reason)

    def on_cancel(self, hook: Callable[[str], None]) -> None:
        """Run ``hook(reason)`` when the client cancels this call (at once if it already did)."""
        with self._lock:
            reason = self.cancelled
            if reason is None:
                self._on_cancel.append(hook)
        if reason is not None:
            hook(reason)

    def progress(self, message: str, total: float | None = None) -> None:
        """A progress notification, if the client asked for them (its request carried a token)."""
        if self.progress_token is None or self.done.is_set():
            return
        with self._lock:
            self._progress += 1
            params: dict[str, Any] = {"progressToken": self.progress_token, "progress": self._progress,
                                      "message": message}
        if total is not None:
            params["total"] = total
        self._send({"jsonrpc": "2.0", "method": "notifications/progress", "params": params})


class Server:
    """What every session of one server shares: the tool catalog and how the server presents itself."""

    def __init__(self, catalog: Catalog, *, name: str, version: str, instructions: str,
                 on_session_end: Callable[[Session], None] | None = None) -> None:
        self.catalog = catalog
        self.name = name
        self.version = version
        self.instructions = instructions
        self.on_session_end = on_session_end

    def session(self, send: Send, *, session_id: str | None = None) -> Session:
        return Session(self, send, session_id=session_id)


class Session:
    """One client's conversation with the server."""

    def __init__(self, server: Server, send: Send, *, session_id: str | None = None) -> None:
        self.server = server
        self.id = session_id or f"stdio-{id(self):x}"
        self._send_raw = send
        self._send_lock = threading.Lock()
        self._calls: dict[Any, Call] = {}
        self._calls_lock = threading.Lock()
        self.protocol_version: str | None = None
        self.client: Mapping[str, Any] = {}
        self.closed = False

    # -- the wire ------------------------------------------------------------------------------

    def send(self, message: Message) -> None:
        # (a client that went away: its session ends with the transport)
        with self._send_lock, contextlib.suppress(OSError, ValueError):
            self._send_raw(message)

    def receive_text(self, text: str | bytes) -> None:
        """One message (or batch) as read from the wire."""
        try:
            message = json.loads(text)
        except ValueError as exc:
            self.send(_error(None, PARSE_ERROR, f"not JSON: {exc}"))
            return
        self.receive(message)

    def receive(self, message: Any) -> None:
        if isinstance(message, list):  # a batch (2025-03-26 allowed them): each on its own
            for item in message:
                self.receive(item)
            return
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            self.send(_error(_id_of(message), INVALID_REQUEST, "not a JSON-RPC 2.0 message"))
            return
        method = message.get("method")
        if method is None:
            return  # a response to a request of ours (we send none that need one)
        if not isinstance(method, str):
            self.send(_error(message.get("id"), INVALID_REQUEST, "method must be a string"))
            return
        params = message.get("params")
        if params is not None and not isinstance(params, dict):
            if "id" in message:
                self.send(_error(message["id"], INVALID_PARAMS, "params must be an object"))
            return
        if "id" not in message:
            self._notification(method, params or {})
            return
        self._request(message["id"], method, params or {})

    # -- requests and notifications ------------------------------------------------------------

    def _request(self, request_id: Any, method: str, params: dict[str, Any]) -> None:
        if method == "initialize":
            self.send(_result(request_id, self._initialize(params)))
        elif method == "ping":
            self.send(_result(request_id, {}))
        elif method == "tools/list":
            self.send(_result(request_id, {"tools": self.server.catalog.listing()}))
        elif method == "tools/call":
            self._start_call(request_id, params)
        else:
            self.send(_error(request_id, METHOD_NOT_FOUND, f"method {method!r} is not offered by this server"))

    def _notification(self, method: str, params: dict[str, Any]) -> None:
        if method == "notifications/cancelled":
            with self._calls_lock:
                call = self._calls.get(params.get("requestId"))
            if call is not None:
                call.cancel(str(params.get("reason") or "cancelled by the client"))
        # notifications/initialized and anything else: nothing to do

    def _initialize(self, params: dict[str, Any]) -> dict[str, Any]:
        asked = params.get("protocolVersion")
        self.protocol_version = asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0]
        client = params.get("clientInfo")
        self.client = client if isinstance(client, dict) else {}
        server = self.server
        return {
            "protocolVersion": self.protocol_version,
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": server.name, "title": "hermes-sandboxes", "version": server.version},
            "instructions": server.instructions,
        }

    def _start_call(self, request_id: Any, params: dict[str, Any]) -> None:
        name = params.get("name")
        tool = self.server.catalog.get(name) if isinstance(name, str) else None
        if tool is None:
            self.send(_error(request_id, INVALID_PARAMS, f"unknown tool {name!r}; tools/list names the tools"))
            return
        meta = params.get("_meta")
        token = meta.get("progressToken") if isinstance(meta, dict) else None
        call = Call(request_id, token, self.send)
        with self._calls_lock:
            if self.closed:
                self.send(_error(request_id, INTERNAL_ERROR, "the session is ending"))
                return
            self._calls[request_id] = call
        arguments = params.get("arguments")
        thread = threading.Thread(target=self._run_call, args=(call, name, arguments), daemon=True,
                                  name=f"mcp-call-{request_id}")
        thread.start()

    def _run_call(self, call: Call, name: str, arguments: Any) -> None:
        try:
            result = self._invoke(call, name, arguments)
            call.done.set()
            if call.cancelled is None:  # a cancelled request gets no response (the client moved on)
                self.send(_result(call.request_id, result.to_wire()))
        finally:
            call.done.set()
            with self._calls_lock:
                self._calls.pop(call.request_id, None)

    def _invoke(self, call: Call, name: str, arguments: Any) -> ToolResult:
        tool = self.server.catalog.get(name)
        assert tool is not None
        try:
            return tool.run(CallContext(self, call), arguments)
        except ToolError as exc:
            return ToolResult.failure(str(exc))
        except Exception as exc:  # a bug of ours must not end the server: the model hears what failed
            import traceback

            traceback.print_exc(file=sys.stderr)
            return ToolResult.failure(f"internal error in tool {name}: {type(exc).__name__}: {exc}")

    def in_flight(self, request_id: Any) -> bool:
        """Whether a tool call with this id still runs (its response not sent yet)."""
        with self._calls_lock:
            return request_id in self._calls

    # -- the end -------------------------------------------------------------------------------

    def close(self, wait: float = 10.0) -> None:
        """End the session: cancel what still runs (its commands are killed and recorded as
        interrupted), wait a bounded time for those calls to finish, then let the server clean up
        after the session (its ephemeral sandboxes)."""
        with self._calls_lock:
            if self.closed:
                return
            self.closed = True
            calls = list(self._calls.values())
        for call in calls:
            call.cancel("the client's session ended")
        for call in calls:
            call.done.wait(wait)
        if self.server.on_session_end is not None:
            self.server.on_session_end(self)


def _result(request_id: Any, result: dict[str, Any]) -> Message:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def _error(request_id: Any, code: int, message: str) -> Message:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


def _id_of(message: Any) -> Any:
    return message.get("id") if isinstance(message, dict) else None
