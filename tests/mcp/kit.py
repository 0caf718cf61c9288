"""Helpers of the MCP tests: our server driven by the official MCP SDK's client.

``InProcess`` is an SDK ``Transport`` whose far end is a session of a server built in this process
(over a real backend), so a test sees exactly what a client sees, at the cost of no process start.
``stdio_params`` starts the real command (``hermes-sandboxes mcp``) for the SDK's stdio client.
``drive`` runs an async scenario with a connected ``mcp.Client``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import http.client
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import mcp_types
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.message import SessionMessage

from hermes_sandboxes import backends
from hermes_sandboxes.cli.owners import Owners
from hermes_sandboxes.mcp.protocol import Session
from hermes_sandboxes.mcp.scope import Host, Rules
from hermes_sandboxes.mcp.server import Running, build
from hermes_sandboxes.recorder.state import HostState
from hermes_sandboxes.sandbox import Backend

ROOT = Path(__file__).resolve().parents[2]
COMMAND = str(ROOT / ".venv" / "bin" / "hermes-sandboxes")


def host_for(backend: Backend, state: HostState, **settings: Any) -> Host:
    model = backends.validate(backend.name, settings, where="the MCP tests")
    return Host(backend=lambda: backend, state=lambda: state, settings=lambda: model,
                owners=lambda: Owners(state.backend_dir(backend.key) / "owners"))


def running_for(backend: Backend, state_root: Path, rules: Rules, **settings: Any) -> Running:
    return build(host_for(backend, HostState(state_root, durable=False), **settings), rules)


class InProcess:
    """An SDK transport connected to a new session of ``running`` (in this process)."""

    def __init__(self, running: Running) -> None:
        self.running = running
        self.session: Session | None = None

    async def __aenter__(self) -> Any:
        loop = asyncio.get_running_loop()
        to_client, self._from_server = anyio.create_memory_object_stream[SessionMessage | Exception](math.inf)
        self._to_server, from_client = anyio.create_memory_object_stream[SessionMessage](math.inf)
        self._to_client = to_client

        def send(message: dict[str, Any]) -> None:  # called on the server's threads
            parsed = SessionMessage(mcp_types.jsonrpc_message_adapter.validate_python(message))
            with contextlib.suppress(RuntimeError):  # the client's loop is gone: the test is over
                loop.call_soon_threadsafe(_deliver, to_client, parsed)

        self.session = session = self.running.open_session(send)

        async def pump() -> None:
            async for item in from_client:
                session.receive(item.message.model_dump(by_alias=True, mode="json", exclude_unset=True))

        self._tasks = anyio.create_task_group()
        await self._tasks.__aenter__()
        self._tasks.start_soon(pump)
        return self._from_server, self._to_server

    async def __aexit__(self, *exc: object) -> None:
        self._tasks.cancel_scope.cancel()
        await self._tasks.__aexit__(None, None, None)
        assert self.session is not None
        await anyio.to_thread.run_sync(self.session.close)
        self._to_client.close()


def _deliver(stream: Any, message: SessionMessage) -> None:
    with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
        stream.send_nowait(message)


def stdio_params(*args: str, env: dict[str, str] | None = None) -> StdioServerParameters:
    """``hermes-sandboxes [args...]`` for the SDK's stdio client, with this run's state and config
    (the SDK passes only a safe default environment plus what is named here)."""
    keep = {k: os.environ[k] for k in ("HERMES_SANDBOXES_STATE", "HERMES_SANDBOXES_CONFIG", "XDG_RUNTIME_DIR",
                                       "HERMES_SANDBOXES_HOME") if k in os.environ}
    return StdioServerParameters(command=COMMAND, args=list(args), env={**keep, **(env or {})})


URL = re.compile(r"serving (http://127\.0\.0\.1:(\d+)/mcp)")


@dataclasses.dataclass
class Served:
    url: str
    port: int
    token: str
    token_file: Path
    proc: subprocess.Popen[bytes]
    said: str  # what the server wrote on stderr when it started

    def transport(self, token: str | None = None) -> Any:
        headers = {"Authorization": f"Bearer {self.token if token is None else token}"}
        return streamable_http_client(self.url, http_client=create_mcp_http_client(headers=headers))

    def raw(self, method: str, headers: dict[str, str], body: Any = None) -> tuple[int, dict[str, str], bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        payload = None if body is None else json.dumps(body).encode()
        connection.request(method, "/mcp", body=payload, headers={"Content-Type": "application/json", **headers})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()



Scenario = Callable[[Client], Awaitable[Any]]


def drive(server: Any, scenario: Scenario, **client_options: Any) -> Any:
    """``scenario(client)`` with an SDK client connected to ``server`` (a Transport, URL or stdio params)."""

    async def main() -> Any:
        async with Client(server, **client_options) as client:
            return await scenario(client)

    return anyio.run(main)


def data(result: Any) -> dict[str, Any]:
    """A tool result's structured content (asserting it is there)."""
    assert result.structured_content is not None, result
    content: dict[str, Any] = result.structured_content
    return content


def text(result: Any) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


async def call_ok(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, (tool, arguments, text(result))
    return data(result)


async def call_error(client: Client, tool: str, **arguments: Any) -> str:
    result = await client.call_tool(tool, arguments)
    assert result.is_error, (tool, arguments, text(result))
    return text(result)


def dump(value: Any) -> str:
    return json.dumps(value, default=str)


PYTHON = sys.executable
