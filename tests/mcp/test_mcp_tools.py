"""The MCP server's tools, driven by the official SDK client in-process, over a real local sandbox."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from hermes_sandboxes.backends.local import LocalBackend
from hermes_sandboxes.mcp.scope import Rules
from hermes_sandboxes.mcp.server import Running
from hermes_sandboxes.recorder.records import ExecRecord
from tests.mcp.kit import InProcess, call_error, call_ok, data, drive, running_for, text

TOOLS = {"sandbox_create", "sandbox_list", "sandbox_info", "sandbox_stop", "sandbox_remove", "network_show",
         "exec", "exec_output", "file_read", "file_write", "file_list", "checkpoint_create", "checkpoint_list",
         "checkpoint_show", "checkpoint_diff", "checkpoint_log", "checkpoint_restore", "sandbox_fork"}


def test_the_server_introduces_itself_and_lists_its_tools_with_true_annotations(running: Running) -> None:
    async def scenario(client: Client) -> Any:
        return client.server_info, client.session.instructions, (await client.list_tools()).tools

    info, instructions, tools = drive(InProcess(running), scenario)
    assert info is not None and info.name == "hermes-sandboxes"
    assert instructions is not None and "exec" in instructions and "checkpoint_restore" in instructions
    by_name = {t.name: t for t in tools}
    assert set(by_name) == TOOLS  # network_allow only with --allow-network-changes
    for tool in tools:
        assert tool.description and len(tool.description) > 40, tool.name
        assert tool.input_schema["type"] == "object" and tool.input_schema.get("additionalProperties") is False
        assert tool.annotations is not None, tool.name
    read_only = {n for n, t in by_name.items() if t.annotations.read_only_hint}
    assert read_only == {"sandbox_list", "sandbox_info", "network_show", "exec_output", "file_read", "file_list",
                         "checkpoint_list", "checkpoint_show", "checkpoint_diff", "checkpoint_log"}
    destructive = {n for n, t in by_name.items() if t.annotations.destructive_hint}
    assert destructive == {"exec", "file_write", "sandbox_stop", "sandbox_remove", "checkpoint_restore"}


def test_a_risky_command_names_its_checkpoint_and_the_restore_it_names_brings_the_files_back(
        running: Running, local_backend: LocalBackend, prefix: str) -> None:
    async def scenario(client: Client) -> dict[str, Any]:
        made = await call_ok(client, "sandbox_create", name="proj")
        name = made["sandbox"]
        assert name == f"{prefix}-proj"
        await call_ok(client, "file_write", sandbox="proj", path="/root/app/main.py", content="print('hi')\n")
        ran = await call_ok(client, "exec", sandbox=name, command="cd /root/app && python3 main.py")
        assert (ran["exit_code"], ran["stdout"], ran["checkpoint"]) == (0, "hi\n", None)
        wiped = await client.call_tool("exec", {"sandbox": name, "command": "rm -rf /root/app"})
        told = text(wiped)
        checkpoint = data(wiped)["checkpoint"]
        assert checkpoint is not None and checkpoint["id"] in told, told
        assert checkpoint["undo"] == {"tool": "checkpoint_restore",
                                      "arguments": {"sandbox": name, "checkpoint": checkpoint["id"], "confirm": True}}
        assert f'call checkpoint_restore with {{"sandbox": "{name}", "checkpoint": "{checkpoint["id"]}"' in told
        gone = await call_ok(client, "exec", sandbox=name, command="test -e /root/app/main.py")
        assert gone["exit_code"] == 1
        preview = await call_ok(client, "checkpoint_restore", sandbox=name, checkpoint=checkpoint["id"])
        assert preview["applied"] is False and "confirm true" in preview["message"]
        assert [c["command"] for c in preview["commands"]] == ["rm -rf /root/app", "test -e /root/app/main.py"]
        assert any(c["path"].startswith("root/app") or c["path"].startswith("/root/app")
                   for c in preview["changes"]), preview["changes"]
        still = await call_ok(client, "exec", sandbox=name, command="test -e /root/app/main.py")
        assert still["exit_code"] == 1  # the preview changed nothing
        done = await call_ok(client, "checkpoint_restore", **checkpoint["undo"]["arguments"])
        assert done["applied"] is True
        back = await call_ok(client, "file_read", sandbox=name, path="/root/app/main.py")
        return {"name": name, "back": back, "checkpoint": checkpoint["id"]}

    result = drive(InProcess(running), scenario)
    assert result["back"]["content"] == "print('hi')\n"
    recorded = running.scope.use(result["name"]).recorded
    commands = [r.command for r in recorded.journal.records(sandbox=result["name"]) if isinstance(r, ExecRecord)]
    assert "rm -rf /root/app" in commands  # the one recorded path: the journal has the MCP's commands
    assert result["checkpoint"] in {c.id for c in recorded.checkpoints()}


def test_exec_takes_argv_cwd_env_stdin_and_reports_timeouts_as_124(running: Running) -> None:
    async def scenario(client: Client) -> None:
        name = (await call_ok(client, "sandbox_create", name="ex"))["sandbox"]
        argv = await call_ok(client, "exec", sandbox=name, command=["printf", "%s|", "a b", "c"])
        assert argv["stdout"] == "a b|c|"
        where = await call_ok(client, "exec", sandbox=name, command="pwd; echo $GREETING; cat",
                              cwd="/tmp", env={"GREETING": "hello"}, stdin="from stdin")
        assert where["stdout"] == "/tmp\nhello\nfrom stdin"
        raw = await call_ok(client, "exec", sandbox=name, command="od -An -tx1",
                            stdin_base64=base64.b64encode(b"\x00\xff").decode())
        assert raw["stdout"].split() == ["00", "ff"]
        err = await call_ok(client, "exec", sandbox=name, command="echo oops >&2; exit 3")
        assert (err["exit_code"], err["stderr"]) == (3, "oops\n")
        slow = await client.call_tool("exec", {"sandbox": name, "command": "sleep 30 & sleep 60", "timeout": 0.5})
        assert data(slow)["exit_code"] == 124 and data(slow)["timed_out"] is True
        assert "timed out" in text(slow) and "every process it started were killed" in text(slow)
        left = await call_ok(client, "exec", sandbox=name, command="pgrep -x sleep || echo none")
        assert left["stdout"].strip() == "none"

    drive(InProcess(running), scenario)


def test_long_output_keeps_head_and_tail_says_the_cut_and_exec_output_has_it_all(running: Running) -> None:
    async def scenario(client: Client) -> None:
        name = (await call_ok(client, "sandbox_create", name="out"))["sandbox"]
        ran = await client.call_tool("exec", {"sandbox": name, "command": "seq 1 100000", "max_output": 3000})
        result = data(ran)
        total = len("".join(f"{i}\n" for i in range(1, 100001)))
        assert result["stdout_bytes"] == total and result["cut_bytes"]["stdout"] == total - 3000
        assert result["stdout"].startswith("1\n2\n") and result["stdout"].endswith("99999\n100000\n")
        assert "bytes cut here" in result["stdout"] and result["output_id"] in text(ran)
        pages, offset = [], 0
        while True:
            page = await call_ok(client, "exec_output", output_id=result["output_id"], offset=offset, length=200_000)
            pages.append(page["text"])
            offset = page["end"]
            if not page["more"]:
                break
        assert "".join(pages) == "".join(f"{i}\n" for i in range(1, 100001))

    drive(InProcess(running), scenario)


def test_files_are_binary_safe_and_listed(running: Running) -> None:
    blob = bytes(range(256)) * 4

    async def scenario(client: Client) -> None:
        name = (await call_ok(client, "sandbox_create", name="files"))["sandbox"]
        await call_ok(client, "file_write", sandbox=name, path="/root/d/blob.bin",
                      content_base64=base64.b64encode(blob).decode())
        await call_ok(client, "file_write", sandbox=name, path="/root/d/run.sh", content="#!/bin/sh\necho ran\n",
                      mode="755")
        read = await call_ok(client, "file_read", sandbox=name, path="/root/d/blob.bin")
        assert read["encoding"] == "base64" and base64.b64decode(read["content"]) == blob
        assert (await call_ok(client, "exec", sandbox=name, command="/root/d/run.sh"))["stdout"] == "ran\n"
        listed = await call_ok(client, "file_list", sandbox=name, path="/root/d")
        assert [(e["name"], e["type"], e["size"]) for e in listed["entries"]] == [
            ("blob.bin", "file", len(blob)), ("run.sh", "file", 19)]

    drive(InProcess(running), scenario)


@pytest.mark.parametrize(("tool", "arguments", "said"), [
    ("exec", {"sandbox": "nosuch", "command": "true"}, "there is no sandbox"),
    ("exec", {"sandbox": "box", "command": 42}, "arguments.command must be string or array"),
    ("exec", {"sandbox": "box", "command": "true", "bogus": 1}, "arguments.bogus is not an argument"),
    ("exec", {"sandbox": "box"}, "arguments.command is required"),
    ("exec", {"sandbox": "box", "command": "true", "cwd": "tmp"}, "must be an absolute path"),
    ("exec", {"sandbox": "box", "command": "true", "timeout": -1}, "must be more than 0"),
    ("file_read", {"sandbox": "box", "path": "etc/passwd"}, "must be an absolute path"),
    ("file_read", {"sandbox": "box", "path": "/root/none"}, "no file /root/none"),
    ("file_write", {"sandbox": "box", "path": "/root/big", "content": "x" * (8 * 2**20 + 1)}, "at most"),
    ("file_write", {"sandbox": "box", "path": "/root/f"}, "exactly one of content"),
    ("checkpoint_restore", {"sandbox": "box", "checkpoint": "nope"}, "has no checkpoint 'nope'"),
    ("sandbox_create", {"name": "Bad_Name"}, "invalid sandbox name"),
    ("exec", {"command": "true"}, "give the sandbox's name"),
])
def test_bad_calls_are_tool_errors_that_say_why_and_the_server_goes_on(
        running: Running, tool: str, arguments: dict[str, Any], said: str) -> None:
    async def scenario(client: Client) -> None:
        await call_ok(client, "sandbox_create", name="box")
        message = await call_error(client, tool, **arguments)
        assert said in message, message
        assert (await call_ok(client, "exec", sandbox="box", command="echo alive"))["stdout"] == "alive\n"

    drive(InProcess(running), scenario)


def test_sandboxes_outside_the_prefix_are_refused(running: Running, local_backend: LocalBackend, prefix: str) -> None:
    other = local_backend.create(f"x{prefix}-other")
    try:
        async def scenario(client: Client) -> None:
            message = await call_error(client, "exec", sandbox=other.name, command="true")
            assert f"there is no sandbox {prefix}-x{prefix}-other" in message  # prefixed: never the other one
            listed = await call_ok(client, "sandbox_list")
            assert other.name not in {s["name"] for s in listed["sandboxes"]}

        drive(InProcess(running), scenario)
    finally:
        other.destroy()


def test_an_unknown_tool_is_a_protocol_error_and_the_session_goes_on(running: Running) -> None:
    async def scenario(client: Client) -> str:
        from mcp.shared.exceptions import MCPError

        with pytest.raises(MCPError) as raised:
            await client.call_tool("no_such_tool", {})
        assert (await call_ok(client, "sandbox_list"))["sandboxes"] == []
        return str(raised.value)

    assert "unknown tool 'no_such_tool'" in drive(InProcess(running), scenario)


def test_a_second_risky_command_is_told_truly_whether_its_checkpoint_is_new_or_a_reused_undo_point(
        running: Running) -> None:
    async def scenario(client: Client) -> tuple[dict[str, Any], bool | None, dict[str, Any], str]:
        name = (await call_ok(client, "sandbox_create", name="reuse"))["sandbox"]
        first = (await call_ok(client, "exec", sandbox=name, command="rm -rf /root/nothing-here"))["checkpoint"]
        # whether the store can tell that nothing changed (a copy store cannot: then a new one is taken)
        can_tell = running.scope.use(name).recorded.inner.changed_since(first["id"])
        again = await client.call_tool("exec", {"sandbox": name, "command": "rm -rf /root/nothing-here"})
        return first, can_tell, data(again)["checkpoint"], text(again)

    first, can_tell, again, told = drive(InProcess(running), scenario)
    assert first["fresh"] is True
    if can_tell is False:  # the store is sure nothing changed: the recorder must reuse it
        assert again["id"] == first["id"]
    if again["id"] == first["id"]:  # reused (btrfs may also answer "maybe changed": then a new one)
        assert again["fresh"] is False
        assert "is the undo point (nothing changed since it was taken)" in told and "was taken before" not in told
    else:
        assert again["fresh"] is True and "was taken before this command" in told


def test_network_changes_are_refused_unless_the_server_allows_them(running: Running, local_backend: LocalBackend,
                                                                   tmp_path: Path, prefix: str) -> None:
    async def closed(client: Client) -> None:
        assert "network_allow" not in {t.name for t in (await client.list_tools()).tools}
        refused = await call_error(client, "sandbox_create", name="net", network="host")
        assert "arguments.network is not an argument" in refused
        await call_ok(client, "sandbox_create", name="net")
        shown = await call_ok(client, "network_show", sandbox="net")
        assert shown["network"] == "none" and "only the user can change it" in shown["message"]

    drive(InProcess(running), closed)
    opened = running_for(local_backend, tmp_path / "open-state", Rules(prefix=prefix, allow_network_changes=True))
    try:
        async def allowed(client: Client) -> None:
            name = (await call_ok(client, "sandbox_create", name="proxied", network="proxy",
                                  allow=["pypi.org"]))["sandbox"]
            changed = await call_ok(client, "network_allow", sandbox=name, add=["example.com"], remove=["pypi.org"])
            assert changed["allow"] == ["example.com"]
            assert (await call_ok(client, "network_show", sandbox=name))["allow"] == ["example.com"]

        drive(InProcess(opened), allowed)
    finally:
        opened.close()


def test_stop_show_and_a_diff_between_two_checkpoints(running: Running) -> None:
    async def scenario(client: Client) -> None:
        name = (await call_ok(client, "sandbox_create", name="story"))["sandbox"]
        first = (await call_ok(client, "checkpoint_create", sandbox=name, comment="empty"))["checkpoint"]["id"]
        await call_ok(client, "exec", sandbox=name, command="echo one > /root/one")
        second = (await call_ok(client, "checkpoint_create", sandbox=name, comment="one"))["checkpoint"]["id"]
        await call_ok(client, "exec", sandbox=name, command="echo two > /root/two")
        shown = await call_ok(client, "checkpoint_show", sandbox=name, checkpoint=second)
        assert shown["checkpoint"]["previous"] == first and shown["checkpoint"]["trigger"] == "agent"
        assert [c["command"] for c in shown["checkpoint"]["commands"]] == ["echo one > /root/one"]
        between = await call_ok(client, "checkpoint_diff", sandbox=name, checkpoint=first, to=second)
        assert [c["path"].lstrip("/") for c in between["changes"]] == ["root/one"]
        await call_ok(client, "exec", sandbox=name, command="sleep 300 >/dev/null 2>&1 &")
        await call_ok(client, "sandbox_stop", sandbox=name)
        after = await call_ok(client, "exec", sandbox=name, command="pgrep -x sleep || echo none; cat /root/two")
        assert after["stdout"] == "none\ntwo\n"  # processes gone, files kept

    drive(InProcess(running), scenario)


def test_a_sandbox_removed_and_made_again_behind_the_servers_back_is_used_afresh(
        running: Running, local_backend: LocalBackend) -> None:
    async def scenario(client: Client) -> None:
        name = (await call_ok(client, "sandbox_create", name="again"))["sandbox"]
        await call_ok(client, "exec", sandbox=name, command="echo first > /root/f")
        local_backend.get(name).destroy()  # as `hermes-sandboxes rm` would, from another process
        gone = await call_error(client, "exec", sandbox=name, command="cat /root/f")
        assert name in gone
        await call_ok(client, "sandbox_create", name="again")
        fresh = await call_ok(client, "exec", sandbox=name, command="test -e /root/f; echo $?")
        assert fresh["stdout"] == "1\n"

    drive(InProcess(running), scenario)


def test_the_journal_names_the_client_and_session_of_each_command(running: Running) -> None:
    async def scenario(client: Client) -> str:
        name = str((await call_ok(client, "sandbox_create", name="origin"))["sandbox"])
        await call_ok(client, "exec", sandbox=name, command="true")
        return name

    name = drive(InProcess(running), scenario)
    [record] = [r for r in running.scope.use(name).recorded.journal.records(sandbox=name)
                if isinstance(r, ExecRecord) and r.command == "true"]
    assert record.origin["via"] == "mcp" and record.origin["client"] == "mcp"  # the SDK's default client name
    assert record.origin["session"].startswith("stdio-")
