"""The faces as a normal user (#19 point 7): Hermes's agent loop (``hermes chat -q`` with the
scripted model), the CLI's demo, the CLI's commands, and the MCP server over stdio, all rootless."""

from __future__ import annotations

import json
from pathlib import Path

from tests.rootless import kit


def test_hermes_chat_breaks_and_restores_a_sandbox_as_a_normal_user(rootless_user: kit.TestUser) -> None:
    seen = rootless_user.scenario("hermes")
    made, broke, restored, after = seen["results"][:4]
    assert made["exit_code"] == 0 and made["output"].startswith("0\n") and "git version" in made["output"]
    assert broke["exit_code"] == 0
    assert "rm -rf /root/app /etc/apt" in restored["discarded_commands"]
    assert after["exit_code"] == 0 and "v1" in after["output"], seen["output"]


def test_the_demo_passes_as_a_normal_user(rootless_user: kit.TestUser) -> None:
    out = rootless_user.run([str(rootless_user.home / "venv" / "bin" / "hermes-sandboxes"), "demo"])
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert "Demo passed" in out.stdout
    # its base is the rootless Debian root, not the host's, and what the sandbox deleted stayed in it
    assert "its base: /" in out.stdout and "not the host's root" in out.stdout
    assert "/usr/bin/git is still there" in out.stdout and "/usr/bin/python3 is still there" in out.stdout


def test_doctor_as_a_normal_user_says_rootless_and_what_is_enforced(rootless_user: kit.TestUser) -> None:
    out = rootless_user.run([str(rootless_user.home / "venv" / "bin" / "hermes-sandboxes"), "doctor"])
    assert out.returncode == 0, out.stdout + out.stderr
    assert "rootless (uid" in out.stdout and "limits (no delegated cgroup)" in out.stdout
    assert "subordinate ids" in out.stdout and "FAIL" not in out.stdout


def test_the_cli_and_its_warm_exec_server_work_as_a_normal_user(rootless_user: kit.TestUser) -> None:
    cli = str(rootless_user.home / "venv" / "bin" / "hermes-sandboxes")
    script = (f"{cli} create warm >/dev/null && {cli} exec warm -- echo one && {cli} exec warm -- id -u && "
              f"{cli} checkpoint create warm -m first >/dev/null && {cli} ls && {cli} rm --yes warm")
    out = rootless_user.run(["sh", "-c", script])
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("one\n0\n") and "\nwarm  running" in out.stdout
    assert "destroyed warm" in out.stderr

    def command_line(pid: int) -> bytes:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return b""

    servers = [pid for pid in rootless_user.processes() if b"cli.fastpath.server" in command_line(pid)]
    assert servers, "no warm exec server of the user's runs"


def test_the_mcp_server_over_stdio_works_as_a_normal_user(rootless_user: kit.TestUser) -> None:
    """``hermes-sandboxes mcp`` spawned by an MCP client (the official SDK's) as the user, with the
    user's own defaults: create, exec, the automatic checkpoint of a destructive command, restore."""
    from mcp import Client, StdioServerParameters

    from tests.mcp.kit import call_ok, data, drive, text

    cli = str(rootless_user.home / "venv" / "bin" / "hermes-sandboxes")
    variables = [f"{k}={v}" for k, v in rootless_user.env().items()]
    params = StdioServerParameters(command="runuser", args=["-u", rootless_user.name, "--", "env", "-i",
                                                            *variables, cli, "mcp"], cwd=str(rootless_user.home))

    async def scenario(client: Client) -> tuple[str, str, str, str]:
        name = str((await call_ok(client, "sandbox_create", name="mcp-rootless"))["sandbox"])
        inside = await call_ok(client, "exec", sandbox=name,
                               command="id -u; head -1 /proc/self/uid_map; mkdir -p /root/p && echo keep > /root/p/f")
        wiped = await client.call_tool("exec", {"sandbox": name, "command": "rm -rf /root/p"})
        checkpoint = data(wiped)["checkpoint"]["id"]
        assert checkpoint in text(wiped)
        await call_ok(client, "checkpoint_restore", sandbox=name, checkpoint=checkpoint, confirm=True)
        back = await call_ok(client, "file_read", sandbox=name, path="/root/p/f")
        return name, json.dumps(inside), str(back["content"]), checkpoint

    name, inside, content, checkpoint = drive(params, scenario)
    try:
        assert content == "keep\n"
        assert f"0 {rootless_user.uid} 1" in " ".join(inside.split()), inside  # root inside is the user
        listed = rootless_user.run([cli, "checkpoint", "list", name])  # the user's own store has it
        assert listed.returncode == 0 and checkpoint in listed.stdout, listed.stdout + listed.stderr
    finally:
        gone = rootless_user.run([cli, "rm", "--yes", name])
        assert gone.returncode == 0, gone.stderr
