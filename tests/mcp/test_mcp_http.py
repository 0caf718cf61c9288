"""``hermes-sandboxes mcp --http``: the real command on 127.0.0.1, driven by the SDK's streamable HTTP
client with the bearer token, and refused without it or from a foreign Host or Origin."""

from __future__ import annotations

import os
import stat
from typing import Any

import anyio
import pytest
from mcp import Client

from hermes_sandboxes.backends.local import LocalBackend
from hermes_sandboxes.recorder.records import ExecRecord
from hermes_sandboxes.recorder.state import HostState
from tests.mcp.kit import Served, call_ok, data, text
from tests.mcp.test_mcp_sessions import _until


def drive_http(transport: Any, scenario: Any) -> Any:
    async def main() -> Any:
        async with Client(transport) as client:
            return await scenario(client)

    return anyio.run(main)


def test_the_token_is_made_once_and_kept_private(served: Served) -> None:
    mode = stat.S_IMODE(served.token_file.stat().st_mode)
    assert mode == 0o600 and stat.S_IMODE(served.token_file.parent.stat().st_mode) == 0o700
    assert len(served.token) >= 32
    assert served.token not in served.said and str(served.token_file) in served.said  # the file, never the token


def test_an_sdk_client_with_the_token_runs_commands_with_progress_and_restores(served: Served) -> None:
    async def scenario(client: Client) -> tuple[list[str], str]:
        name = (await call_ok(client, "sandbox_create", name="web"))["sandbox"]
        await call_ok(client, "file_write", sandbox=name, path="/root/site/index.html", content="<h1>hi</h1>\n")
        messages: list[str] = []

        async def progress(progress: float, total: float | None, message: str | None) -> None:
            messages.append(message or "")

        slow = await client.call_tool("exec", {"sandbox": name, "command": "echo started; sleep 2.5; echo over"},
                                      progress_callback=progress)
        assert data(slow)["stdout"] == "started\nover\n"
        wiped = await client.call_tool("exec", {"sandbox": name, "command": "rm -rf /root/site"})
        undo = data(wiped)["checkpoint"]["undo"]
        assert undo["tool"] == "checkpoint_restore" and undo["arguments"]["checkpoint"] in text(wiped)
        await call_ok(client, "checkpoint_restore", **undo["arguments"])
        back = await call_ok(client, "file_read", sandbox=name, path="/root/site/index.html")
        return messages, back["content"]

    messages, content = drive_http(served.transport(), scenario)
    assert content == "<h1>hi</h1>\n"
    assert messages and any("started" in m for m in messages), messages  # progress streamed while it ran


def test_a_cancelled_call_over_http_kills_the_command_and_records_it(served: Served, local_backend: LocalBackend,
                                                                      prefix: str) -> None:
    async def scenario(client: Client) -> str:
        name = str((await call_ok(client, "sandbox_create", name="cancel"))["sandbox"])
        ready = anyio.Event()

        async def progress(progress: float, total: float | None, message: str | None) -> None:
            if message and "ready" in message:
                ready.set()

        async with anyio.create_task_group() as tasks:
            async def run() -> None:
                await client.call_tool("exec", {"sandbox": name, "command": "echo ready; sleep 300"},
                                       progress_callback=progress)

            tasks.start_soon(run)
            await ready.wait()
            tasks.cancel_scope.cancel()
        after = await call_ok(client, "exec", sandbox=name, command="echo still-serving")
        assert after["stdout"] == "still-serving\n"
        return name

    name = drive_http(served.transport(), scenario)
    journal = HostState(os.environ["HERMES_SANDBOXES_STATE"]).journal(local_backend, name)

    def ended() -> list[ExecRecord]:
        return [r for r in journal.records_of(ExecRecord, sandbox=name) if r.command == "echo ready; sleep 300"]

    [record] = _until(ended, "the cancelled command's end in the journal")
    assert record.killed and record.error is not None and "cancelled" in record.error


def test_deleting_the_session_destroys_its_ephemeral_sandboxes(served: Served, local_backend: LocalBackend) -> None:
    async def scenario(client: Client) -> str:
        return str((await call_ok(client, "sandbox_create", ephemeral=True))["sandbox"])

    temp = drive_http(served.transport(), scenario)  # the SDK client DELETEs its session on exit
    _until(lambda: temp not in {i.name for i in local_backend.list()}, f"{temp} destroyed with its session")


INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}


@pytest.mark.parametrize(("headers", "status"), [
    ({}, 401),
    ({"Authorization": "Bearer wrong"}, 401),
    ({"Authorization": "TOKEN", "Host": "evil.example:{port}"}, 403),
    ({"Authorization": "TOKEN", "Origin": "http://evil.example"}, 403),
    ({"Authorization": "TOKEN", "Origin": "http://127.0.0.1:{port}.evil.example"}, 403),
    ({"Authorization": "TOKEN", "Origin": "http://localhost:{port}"}, 200),
    ({"Authorization": "TOKEN"}, 200),
])
def test_requests_without_the_token_or_from_a_foreign_host_or_origin_are_refused(
        served: Served, headers: dict[str, str], status: int) -> None:
    given = {k: v.replace("{port}", str(served.port)).replace("TOKEN", f"Bearer {served.token}")
             for k, v in headers.items()}
    code, answer_headers, body = served.raw("POST", {"Accept": "application/json, text/event-stream", **given}, INIT)
    assert code == status, body
    if status == 200:
        session = answer_headers["Mcp-Session-Id"]
        assert b'"protocolVersion"' in body
        code, _, _ = served.raw("DELETE", {"Authorization": f"Bearer {served.token}", "Mcp-Session-Id": session})
        assert code == 204
    else:
        assert served.token.encode() not in body


def test_a_request_of_an_unknown_session_is_404(served: Served) -> None:
    code, _, _ = served.raw("POST", {"Authorization": f"Bearer {served.token}", "Mcp-Session-Id": "nope"},
                            {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
    assert code == 404
