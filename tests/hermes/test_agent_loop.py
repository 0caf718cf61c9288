"""The real Hermes agent loop (``hermes chat -q``) driving the sandbox backend, its model played by a
scripted OpenAI-compatible server on 127.0.0.1. Each test asserts on what the model was told."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from hermes_sandboxes.recorder.state import HostState
from tests.cli.cli_kit import as_json
from tests.fakes.model_server import Conversation, Step, call, say
from tests.hermes.loop_kit import checkpoint_named

if TYPE_CHECKING:
    from tests.hermes.loop_kit import AgentLoop


def sandbox_tool(name: str, **arguments: Any) -> Step:
    """In this Hermes version plugin tools are deferred: the model reaches them through tool_call."""
    return call("tool_call", calls=[{"name": name, "arguments": arguments}])


def terminal(command: str, **arguments: Any) -> Step:
    return call("terminal", command=command, **arguments)


def with_named_checkpoint(build: Any) -> Any:
    """A step built from the checkpoint id named in an earlier terminal result."""
    def step(conversation: Conversation) -> Step:
        for text in conversation.tool_results():
            if "was taken before this command" in text:
                built: Step = build(checkpoint_named(text))
                return built
        raise AssertionError(f"no checkpoint was named to the model: {conversation.tool_results()}")
    return step


def test_break_and_restore(agent_loop: AgentLoop) -> None:
    run = agent_loop.ask([
        terminal("mkdir -p /root/app && echo v1 > /root/app/main.py && git --version"),
        terminal("rm -rf /root/app /usr/bin/git"),
        with_named_checkpoint(lambda cp: sandbox_tool("sandbox_diff", id=cp)),
        with_named_checkpoint(lambda cp: sandbox_tool("sandbox_restore", id=cp)),
        terminal("git --version && cat /root/app/main.py"),
        say("restored"),
    ])
    made, broke, diff, restored, after = run.tool_json()
    assert "git version" in made["output"]
    named = checkpoint_named(broke["output"])
    changed = {c["path"]: c["change"] for c in diff["changes"]}
    assert changed["/root/app/main.py"] == "deleted" and changed["/usr/bin/git"] == "deleted"
    assert restored["restored"] == named and "rm -rf /root/app /usr/bin/git" in restored["discarded_commands"]
    assert after["exit_code"] == 0 and "git version" in after["output"] and "v1" in after["output"]
    assert "sandbox_restore" in run.conversations[0].tool_search_catalog()
    # Hermes's system-prompt probe ran (the model was told the sandbox's OS) and left no sandbox
    system = json.dumps([m for m in run.conversations[0].messages if m.get("role") == "system"])
    assert "OS: Linux" in system, system
    assert [n for n in agent_loop.sandbox_names() if not n.startswith(agent_loop.prefix + "-default-")] == []


def test_the_audit_records_of_hermes_chat_carry_its_session_id(agent_loop: AgentLoop) -> None:
    marker = f"audited-{secrets.token_hex(4)}"
    run = agent_loop.ask([terminal(f"echo {marker}"), say("done")])
    [result] = run.tool_json()
    assert marker in result["output"], result
    audit = HostState().audit_path(agent_loop.backend.key)
    records = [json.loads(line) for line in audit.read_text().splitlines() if marker in line]
    [ended] = [r for r in records if r["type"] == "exec"]
    session = ended["origin"].get("session")
    assert session and ended["origin"]["via"] == "hermes", ended  # the docs say the session is recorded
    assert session in run.output, (session, run.output[-500:])  # the id hermes chat itself reports


def test_a_background_server_is_reached_from_a_later_command(agent_loop: AgentLoop) -> None:
    agent_loop.settings["network"] = "loopback"
    run = agent_loop.ask([
        terminal("mkdir -p /srv/site && echo hello-site > /srv/site/index.html"),
        terminal("cd /srv/site && python3 -m http.server 8765 --bind 127.0.0.1", background=True),
        terminal(POLL_SERVER),
        say("served"),
    ])
    _, started, fetched = run.tool_json()
    assert started.get("session_id") and started["exit_code"] == 0
    assert "hello-site" in fetched["output"], fetched


POLL_SERVER = ("for i in $(seq 100); do curl -sf http://127.0.0.1:8765/index.html && exit 0; sleep 0.1; done;"
               " echo never-answered; exit 1")


# a child in its own session, out of the command's process group (Hermes refuses nohup/setsid/& in a
# foreground command, so the detaching is done by a program)
DETACH_AND_HANG = ("python3 -c \"import subprocess; subprocess.Popen(['sleep', '477'], start_new_session=True)\";"
                   " sleep 478")


def test_a_timeout_kills_the_command_and_its_detached_children(agent_loop: AgentLoop) -> None:
    run = agent_loop.ask([
        terminal(DETACH_AND_HANG, timeout=2),
        terminal("pgrep -f 'sleep 47[78]' || echo no-sleepers-left"),
        say("done"),
    ])
    timed_out, after = run.tool_json()
    assert timed_out["exit_code"] == 124, timed_out
    assert after["output"].strip() == "no-sleepers-left", after


def test_cwd_and_exported_variables_persist_between_commands(agent_loop: AgentLoop) -> None:
    run = agent_loop.ask([
        terminal("mkdir -p /root/work && cd /root/work && export GREETING=persisted"),
        terminal("pwd && echo $GREETING"),
        say("done"),
    ])
    _, after = run.tool_json()
    assert after["output"].split() == ["/root/work", "persisted"], after


def test_an_ephemeral_sandbox_is_used_and_then_destroyed(agent_loop: AgentLoop) -> None:
    agent_loop.terminal["container_persistent"] = False
    run = agent_loop.ask([terminal("echo inside > /root/mark && hostname"), say("done")])
    (result,) = run.tool_json()
    used = result["output"].strip()  # a sandbox's hostname is its name
    assert used.startswith(agent_loop.prefix + "-"), result
    assert used not in agent_loop.backend.names()
    assert agent_loop.sandbox_names() == []  # the system-prompt probe's sandbox is gone too
    assert not Path("/root/mark").exists()


def test_invalid_settings_reach_the_model_as_an_error_and_nothing_runs(agent_loop: AgentLoop) -> None:
    marker = Path(f"/tmp/agent-loop-{secrets.token_hex(4)}")
    agent_loop.settings_yaml = f"name_prefix: {agent_loop.prefix}\nmemory: 2048\n"
    run = agent_loop.ask([terminal(f"touch {marker}"), say("could not")])
    (result,) = run.tool_json()
    assert "plugins.entries.sandbox.settings.memory" in json.dumps(result), result
    assert "expected a size with a unit" in json.dumps(result)
    assert not marker.exists()
    assert agent_loop.sandbox_names() == []


def test_without_the_plugin_enabled_there_is_no_fallback_to_the_host(agent_loop: AgentLoop) -> None:
    # what docs/hermes.md says: terminal.backend names a provider nobody loaded, so the terminal and
    # file tools are not offered and execute_code fails (nothing runs on the host instead)
    agent_loop.enabled = []
    run = agent_loop.ask([call("execute_code", code="print('ran-' + 'somewhere')"), say("no terminal here")])
    tools = run.last.tool_names
    assert tools and not {"terminal", "read_file", "write_file"} & set(tools), tools
    (result,) = run.tool_results()
    assert "Unknown environment type: sandbox" in result and "ran-somewhere" not in result, result
    assert agent_loop.sandbox_names() == []


RISKY = "rm -rf /root/app"


def test_an_approval_denied_in_single_query_mode_runs_nothing_and_takes_no_checkpoint(
        agent_loop: AgentLoop) -> None:
    agent_loop.approvals["single_query_mode"] = "deny"
    run = agent_loop.ask([terminal("mkdir -p /root/app && touch /root/app/keep"), terminal(RISKY),
                          terminal("ls /root/app"), say("blocked")])
    _, denied, after = run.tool_json()
    assert denied["status"] == "blocked" and "single_query_mode" in denied["error"], denied
    assert "checkpoint" not in json.dumps(denied)
    assert "keep" in after["output"]
    assert agent_loop.sandbox().checkpoints() == []


@pytest.mark.parametrize("policy", ["risky", "off"])
def test_an_approved_dangerous_command_runs_after_an_automatic_checkpoint_if_the_policy_wants_one(
        agent_loop: AgentLoop, policy: str) -> None:
    agent_loop.settings["auto_checkpoint"] = policy
    run = agent_loop.ask([terminal("mkdir -p /root/app && touch /root/app/keep"), terminal(RISKY),
                          terminal("ls /root/app || echo gone"), say("done")])
    _, approved, after = run.tool_json()
    assert approved["exit_code"] == 0 and "gone" in after["output"]
    checkpoints = agent_loop.sandbox().checkpoints()
    if policy == "risky":
        assert [c.id for c in checkpoints] == [checkpoint_named(approved["output"])]
    else:
        assert "checkpoint" not in approved["output"] and checkpoints == []


def test_a_named_checkpoint_survives_a_flood_of_execute_code_and_file_tools(agent_loop: AgentLoop) -> None:
    flood: list[Step] = []
    for i in range(12):
        flood.append(call("execute_code", code=f"print({i} * 2)"))
        flood.append(call("write_file", path=f"/root/notes/n{i}.txt", content=f"note {i}\n"))
        flood.append(call("read_file", path=f"/root/notes/n{i}.txt"))
    run = agent_loop.ask([
        terminal("mkdir -p /root/app && echo v1 > /root/app/main.py"),
        terminal("rm -rf /root/app"),
        *flood,
        with_named_checkpoint(lambda cp: sandbox_tool("sandbox_diff", id=cp)),
        with_named_checkpoint(lambda cp: sandbox_tool("sandbox_restore", id=cp)),
        terminal("cat /root/app/main.py"),
        say("restored"),
    ], timeout=400)
    results = run.tool_json()
    named = checkpoint_named(results[1]["output"])
    diff, restored, after = results[-3:]
    assert all(r.get("status") == "success" for r in results[2:-3:3]), "every execute_code ran"
    assert not [c for c in diff["changes"] if "/tmp/hermes" in c["path"]], "scratch files are not the agent's"
    assert restored["restored"] == named and after["output"].strip() == "v1"
    assert not [c for c in restored["discarded_commands"] if "hermes_rkernel" in c or "__HERMES_" in c]

    sandbox = agent_loop.sandbox().name
    assert named in [c["id"] for c in as_json(agent_loop.backend.home, "checkpoint", "list", sandbox)]
    everything = as_json(agent_loop.backend.home, "log", sandbox, "--all")
    told = as_json(agent_loop.backend.home, "log", sandbox)
    internal = [r for r in everything if r.get("internal")]
    assert any("/rpc/req_*" in r["command"] for r in internal) and not [r for r in told if r.get("internal")]
    autos = [r for r in everything if r["type"] == "checkpoint" and r["trigger"] == "auto"]
    assert [r["id"] for r in autos] == [named], "Hermes's housekeeping took no checkpoint"
