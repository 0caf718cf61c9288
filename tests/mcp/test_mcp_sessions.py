"""Sessions of the MCP server: cancellation, two clients at once, ephemeral sandboxes that end with
their session, a pinned server, and the stdio transport as a client spawns it (the real command)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from hermes_sandboxes.backends.local import LocalBackend
from hermes_sandboxes.errors import SandboxNotFound
from hermes_sandboxes.mcp.scope import Rules
from hermes_sandboxes.mcp.server import Running
from hermes_sandboxes.recorder.records import ExecRecord
from hermes_sandboxes.sandbox import SandboxSpec
from tests.mcp.kit import COMMAND, InProcess, call_error, call_ok, data, drive, running_for, stdio_params, text


def _until(check: Any, what: str, within: float = 60.0) -> Any:
    """Poll ``check()`` until it returns something true (an event we cannot wait on directly)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"never happened: {what}")


def test_a_cancelled_exec_kills_the_command_tree_and_is_recorded_as_interrupted(running: Running) -> None:
    async def scenario(client: Client) -> str:
        name = str((await call_ok(client, "sandbox_create", name="cancel"))["sandbox"])
        ready = anyio.Event()

        async def progress(progress: float, total: float | None, message: str | None) -> None:
            if message and "ready" in message:
                ready.set()

        async with anyio.create_task_group() as tasks:
            async def run() -> None:
                await client.call_tool("exec", {"sandbox": name, "command": "sleep 300 & echo ready; sleep 301"},
                                       progress_callback=progress)

            tasks.start_soon(run)
            await ready.wait()  # the command runs and its output reached us as progress
            tasks.cancel_scope.cancel()
        return name

    name = str(drive(InProcess(running), scenario))
    recorded = running.scope.use(name).recorded

    def ended() -> list[ExecRecord]:
        return [r for r in recorded.journal.records(sandbox=name)
                if isinstance(r, ExecRecord) and r.command.startswith("sleep 300")]

    [record] = _until(ended, "the cancelled command's end in the journal")
    assert record.killed and record.error is not None and "cancelled" in record.error, record
    left = recorded.inner.exec("pgrep -x sleep || echo none", timeout=30)
    assert left.stdout.strip() == "none"  # the backgrounded sleep too: the whole tree


def test_two_clients_use_one_sandbox_at_once(running: Running) -> None:
    async def scenario(first: Client) -> tuple[dict[str, Any], dict[str, Any]]:
        name = (await call_ok(first, "sandbox_create", name="shared"))["sandbox"]
        async with Client(InProcess(running)) as second:
            results: dict[str, dict[str, Any]] = {}
            async with anyio.create_task_group() as tasks:
                async def waiter() -> None:
                    results["wait"] = await call_ok(first, "exec", sandbox=name, timeout=120,
                                                    command="while [ ! -e /tmp/go ]; do sleep 0.05; done; echo seen")

                tasks.start_soon(waiter)
                # the second client's command runs while the first one's still waits for it
                results["go"] = await call_ok(second, "exec", sandbox=name, command="touch /tmp/go; echo went")
            return results["wait"], results["go"]

    waited, went = drive(InProcess(running), scenario)
    assert (waited["stdout"], went["stdout"]) == ("seen\n", "went\n")


def test_ephemeral_sandboxes_end_with_their_session_and_others_stay(running: Running, local_backend: LocalBackend,
                                                                     prefix: str) -> None:
    async def scenario(client: Client) -> tuple[str, str]:
        temp = await call_ok(client, "sandbox_create", ephemeral=True)
        kept = await call_ok(client, "sandbox_create", name="kept")
        info = await call_ok(client, "sandbox_info", sandbox=temp["sandbox"])
        assert info["owned_by_this_session"] is True and info["info"]["ephemeral"] is True
        return temp["sandbox"], kept["sandbox"]

    temp, kept = drive(InProcess(running), scenario)
    assert temp.startswith(f"{prefix}-tmp-")
    names = {i.name for i in local_backend.list()}
    assert temp not in names and kept in names
    owners = running.scope.host.state().backend_dir(local_backend.key) / "owners"
    assert not (owners / f"{temp}.json").exists()


def test_a_pinned_server_serves_its_one_sandbox_and_creates_it_on_first_use(
        local_backend: LocalBackend, tmp_path: Path, prefix: str) -> None:
    pinned = f"{prefix}-pinned"
    server = running_for(local_backend, tmp_path / "state", Rules(prefix=prefix, pinned=pinned))
    try:
        async def scenario(client: Client) -> None:
            assert (await call_ok(client, "exec", command="echo here"))["sandbox"] == pinned
            message = await call_error(client, "exec", sandbox="other", command="true")
            assert f"serves only sandbox {pinned}" in message
            assert "creates no others" in await call_error(client, "sandbox_create", name="more")

        drive(InProcess(server), scenario)
    finally:
        server.close()
        local_backend.get(pinned).destroy()


def test_a_pinned_sandbox_made_with_another_spec_is_served_as_it_is_and_the_log_says_so(
        local_backend: LocalBackend, tmp_path: Path, prefix: str, capfd: pytest.CaptureFixture[str]) -> None:
    pinned = f"{prefix}-made"
    local_backend.create(pinned, SandboxSpec(network="loopback", labels={"made": "by the cli"}))
    server = running_for(local_backend, tmp_path / "state", Rules(prefix=prefix, pinned=pinned))
    try:
        async def scenario(client: Client) -> dict[str, Any]:
            return await call_ok(client, "exec", command="echo here")

        ran = drive(InProcess(server), scenario)
        assert ran["sandbox"] == pinned and ran["stdout"] == "here\n"
        said = capfd.readouterr().err
        assert f"hermes-sandboxes mcp: sandbox {pinned} exists with network loopback, not" in said, said
        assert "serving it as it is" in said
        assert local_backend.get(pinned).spec.labels == {"made": "by the cli"}
    finally:
        server.close()
        local_backend.get(pinned).destroy()


def test_the_real_command_over_stdio_records_what_it_runs(local_backend: LocalBackend, prefix: str) -> None:
    params = stdio_params("--home", str(local_backend.home), "mcp", "--prefix", prefix)

    async def scenario(client: Client) -> tuple[str, str, str]:
        name = (await call_ok(client, "sandbox_create", name="stdio"))["sandbox"]
        temp = (await call_ok(client, "sandbox_create", ephemeral=True))["sandbox"]
        await call_ok(client, "exec", sandbox=name, command="mkdir -p /root/p && echo keep > /root/p/f")
        wiped = await client.call_tool("exec", {"sandbox": name, "command": "rm -rf /root/p"})
        checkpoint = data(wiped)["checkpoint"]["id"]
        assert checkpoint in text(wiped)
        await call_ok(client, "checkpoint_restore", sandbox=name, checkpoint=checkpoint, confirm=True)
        back = await call_ok(client, "file_read", sandbox=name, path="/root/p/f")
        return name, temp, back["content"]

    name, temp, content = drive(params, scenario)
    try:
        assert content == "keep\n"
        listed = {i.name for i in local_backend.list()}
        assert temp not in listed  # the session ended with the client: its ephemeral sandbox went
        log = subprocess.run([COMMAND, "--home", str(local_backend.home), "log", name, "--json"],
                             capture_output=True, text=True, check=True)
        commands = [r.get("command") for r in json.loads(log.stdout) if r.get("type") == "exec"]
        assert "rm -rf /root/p" in commands  # the CLI reads what the MCP server recorded
    finally:
        local_backend.get(name).destroy()


def test_a_killed_server_leaves_its_ephemeral_sandboxes_to_gc(local_backend: LocalBackend, prefix: str) -> None:
    env = {**os.environ}
    proc = subprocess.Popen([COMMAND, "--home", str(local_backend.home), "mcp", "--prefix", prefix],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    assert proc.stdin is not None and proc.stdout is not None

    def ask(message: dict[str, Any]) -> dict[str, Any]:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(message).encode() + b"\n")
        proc.stdin.flush()
        return dict(json.loads(proc.stdout.readline()))

    try:
        hello = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
        ask({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello})
        made = ask({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                    "params": {"name": "sandbox_create", "arguments": {"ephemeral": True}}})
        temp = made["result"]["structuredContent"]["sandbox"]
        local_backend.get(temp)  # exists
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    gc = subprocess.run([COMMAND, "--home", str(local_backend.home), "gc"], capture_output=True, text=True)
    assert gc.returncode == 0 and temp in gc.stderr, gc.stderr
    try:
        local_backend.get(temp)
    except SandboxNotFound:
        return
    raise AssertionError(f"{temp} survived gc")


def test_initialize_is_answered_before_settings_models_or_backends_are_loaded(local_backend: LocalBackend,
                                                                               prefix: str) -> None:
    """Start-up is the client's deadline: the spawned server answers ``initialize`` on the fast path,
    with no click, pydantic or backend loaded (pydantic's compiled core would be mapped by then)."""
    proc = subprocess.Popen([COMMAND, "--home", str(local_backend.home), "mcp", "--prefix", prefix],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        hello = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}).encode()
                         + b"\n")
        proc.stdin.flush()
        answer = json.loads(proc.stdout.readline())
        assert answer["result"]["serverInfo"]["name"] == "hermes-sandboxes"
        mapped = Path(f"/proc/{proc.pid}/maps").read_text()
        assert "pydantic_core" not in mapped and "_cffi_backend" not in mapped
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "sandbox_list", "arguments": {}}}).encode() + b"\n")
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline())["result"]["isError"] is False
        assert "pydantic_core" in Path(f"/proc/{proc.pid}/maps").read_text()  # the settings, once a tool needs them
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)


def test_mcp_help_comes_from_the_full_cli() -> None:
    shown = subprocess.run([COMMAND, "mcp", "--help"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "--allow-network-changes" in shown.stdout and "claude mcp add" in shown.stdout


def test_a_settings_error_is_a_tool_error_naming_its_source_and_the_server_goes_on(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.toml"
    params = stdio_params("mcp", env={"HERMES_SANDBOXES_CONFIG": str(missing)})

    async def scenario(client: Client) -> tuple[str, str]:
        first = await call_error(client, "sandbox_list")
        tools = [t.name for t in (await client.list_tools()).tools]
        return first, ",".join(tools)

    said, tools = drive(params, scenario)
    assert f"$HERMES_SANDBOXES_CONFIG={missing}" in said and "no such file" in said, said
    assert "exec" in tools.split(",")
