"""``/sandbox`` typed in a Hermes conversation, through Hermes's own plugin command registry, and its
undo note reaching the agent's next turn in a real ``hermes chat -q``."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

from tests.fakes.model_server import say
from tests.hermes.test_agent_loop import terminal

if TYPE_CHECKING:
    from tests.hermes.conftest import HermesHarness
    from tests.hermes.loop_kit import AgentLoop

Slash = Callable[[str], str]
PREVIEW_ID = re.compile(r"/sandbox undo (\S+) --yes")


def _slash() -> Slash:
    from hermes_cli.plugins import get_plugin_command_handler, get_plugin_commands, resolve_plugin_command_result

    entry = get_plugin_commands()["sandbox"]
    assert entry["plugin_key"] in ("sandbox", "sprites", "e2b") and entry["args_hint"], entry
    handler = get_plugin_command_handler("sandbox")
    assert handler is not None
    return lambda args: str(resolve_plugin_command_result(handler(args)) or "")


def as_human(loop: AgentLoop, monkeypatch: pytest.MonkeyPatch, **env: str) -> Slash:
    """This process as the human's side of ``loop``'s profile: its config, its store, its plugin
    manager (the CLI chat and the gateways dispatch ``/sandbox`` through the same registry)."""
    from tests.hermes.conftest import _reset_hermes

    loop.write_config()
    monkeypatch.setenv("HERMES_HOME", str(loop.home))
    monkeypatch.setenv("HERMES_SANDBOXES_HOME", str(loop.backend.home))
    monkeypatch.setenv("TERMINAL_ENV", str(loop.terminal["backend"]))
    monkeypatch.setenv("TERMINAL_CONTAINER_PERSISTENT", "true")
    monkeypatch.delenv("HERMES_SESSION_KEY", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    _reset_hermes()
    return _slash()


@pytest.fixture
def chat(agent_loop: AgentLoop, monkeypatch: pytest.MonkeyPatch) -> Iterator[Slash]:
    yield as_human(agent_loop, monkeypatch)
    from tools.terminal_tool import cleanup_all_environments

    cleanup_all_environments()


def undo_story(loop: AgentLoop, chat: Slash, *, diffs: bool = True) -> str:
    """The agent breaks a project; the human asks ``/sandbox undo``, reads the preview, confirms;
    the agent's next turn is told what was undone and finds the project back. Returns the id."""
    broke = loop.ask([
        terminal("mkdir -p /root/app && echo v1 > /root/app/main.py && echo ok"),
        terminal("rm -rf /root/app"),
        say("I removed the project"),
    ])
    assert broke.returncode == 0, broke.output
    assert "checkpoint" in broke.tool_results()[1], broke.tool_results()

    preview = chat("undo")
    found = PREVIEW_ID.search(preview)
    assert found, preview
    named = found.group(1)
    assert named in broke.tool_results()[1], "the default is the checkpoint named to the agent"
    assert "rm -rf /root/app" in preview and "This throws away" in preview, preview
    if diffs:
        assert "deleted  /root/app/main.py" in preview, preview
    else:
        assert "changes unknown" in preview, preview

    done = chat(f"undo {named} --yes")
    assert done.startswith("Undone:") and named in done, done

    after = loop.ask([terminal("cat /root/app/main.py"), say("the project is back")])
    first = after.conversations[0]
    user = [m for m in first.messages if m.get("role") == "user"][-1]
    text = user["content"] if isinstance(user["content"], str) else str(user["content"])
    assert f"back at checkpoint {named}" in text and "rm -rf /root/app" in text, text
    (cat,) = after.tool_json()
    assert cat["output"].strip() == "v1", cat
    # told once: a later turn does not hear it again
    again = loop.ask([say("nothing to do")])
    assert "undid" not in str(again.conversations[0].messages)
    return named


def test_the_human_undoes_what_the_agent_broke_and_the_agent_hears_of_it(agent_loop: AgentLoop, chat: Slash) -> None:
    undo_story(agent_loop, chat)
    assert agent_loop.sandbox().exec(["cat", "/root/app/main.py"]).stdout == "v1\n"


def test_status_checkpoints_log_diff_and_checkpoint(hermes: HermesHarness) -> None:
    slash = _slash()
    assert "no sandbox yet" in slash(""), "nothing is made by looking"
    hermes.run("mkdir -p /root/proj && echo a > /root/proj/a.txt")
    taken = slash("checkpoint before the refactor")
    cp = re.search(r"Saved checkpoint (\S+) ", taken)
    assert cp, taken
    hermes.run("echo b > /root/proj/b.txt && rm /root/proj/a.txt")
    status = slash("")
    assert f"Last checkpoint: {cp.group(1)}" in status and "running" in status, status
    assert "2 path(s) changed: 1 added, 0 modified, 1 deleted" in status, status
    assert f"/sandbox undo goes back to {cp.group(1)}" in status
    assert cp.group(1) in slash("checkpoints") and "before the refactor" in slash("checkpoints")
    diff = slash("diff")
    assert "added    /root/proj/b.txt" in diff and "deleted  /root/proj/a.txt" in diff, diff
    log = slash("log")
    assert "rm /root/proj/a.txt" in log and f"checkpoint {cp.group(1)} [manual]" in log, log
    for text in (status, diff, log, slash("checkpoints")):
        assert not set(text) & set("┏┃━│─┌┐└┘╭╮"), text  # reads the same in a chat message
    assert "unknown subcommand" in slash("frobnicate")
    assert "no checkpoint 'ck-nope'" in slash("undo ck-nope")


def test_undo_from_the_chat_resyncs_a_live_session_and_fork_leaves_it_alone(hermes: HermesHarness) -> None:
    slash = _slash()
    hermes.run("mkdir -p /root/w && echo keep > /root/w/f")
    cp = re.search(r"Saved checkpoint (\S+) ", slash("checkpoint good"))
    assert cp
    hermes.run("echo junk > /root/w/f")
    forked = slash(f"fork {cp.group(1)} copy")
    assert f"into {hermes.prefix}-copy" in forked, forked
    assert hermes.backend.get(f"{hermes.prefix}-copy").exec(["cat", "/root/w/f"]).stdout == "keep\n"
    assert "To go ahead" in slash("undo")
    assert slash(f"undo {cp.group(1)} --yes").startswith("Undone:")
    assert hermes.run("cat /root/w/f")["output"].strip() == "keep"  # the live environment goes on
    from hermes_sandboxes.hermes import conversation

    env = hermes.env()
    assert conversation.take_note(env.recorded.journal.path) is not None, "the note waits for the agent's next turn"


@contextlib.contextmanager
def _gateway_chat(key: str) -> Iterator[None]:
    """What a gateway binds before a message's plugin command or agent turn (run_inbound.py)."""
    from gateway.session_context import clear_session_vars, set_session_vars

    tokens = set_session_vars(platform="telegram", session_key=key, chat_id=key)
    try:
        yield
    finally:
        clear_session_vars(tokens)


def test_in_a_gateway_each_chat_acts_on_its_own_sessions_sandbox(hermes: HermesHarness) -> None:
    slash = _slash()
    names = {}
    for key in ("agent:main:telegram:dm:1", "agent:main:telegram:dm:2"):
        with _gateway_chat(key):
            hermes.run(f"echo {key[-1]} > /root/who", task_id=f"turn-{key[-1]}")
            names[key] = hermes.env(f"turn-{key[-1]}").sandbox_name
            taken = slash(f"checkpoint chat {key[-1]}")
            assert names[key] in taken, taken
    assert len(set(names.values())) == 2, "a session of its own per chat"
    with _gateway_chat("agent:main:telegram:dm:1"):
        listed = slash("checkpoints")
        assert names["agent:main:telegram:dm:1"] in listed and "chat 1" in listed and "chat 2" not in listed
        hermes.run("echo changed > /root/who", task_id="turn-1")
        cp = PREVIEW_ID.search(slash("undo"))
        assert cp, "the chat's own checkpoint is its undo point"
        assert slash(f"undo {cp.group(1)} --yes").startswith("Undone:")
        assert hermes.run("cat /root/who", task_id="turn-1")["output"].strip() == "1"
    with _gateway_chat("agent:main:telegram:dm:2"):
        assert hermes.run("cat /root/who", task_id="turn-2")["output"].strip() == "2"
        assert "chat 2" in slash("")


def test_hermes_refuses_its_own_rollback_for_this_backend(hermes: HermesHarness) -> None:
    # what docs/hermes.md says: Hermes's /rollback takes host checkpoints and refuses them for a
    # container backend, ours included; /sandbox undo is the way
    from tools.checkpoint_manager import CheckpointManager

    hermes.run("true")
    reason = CheckpointManager(enabled=True).unsupported_backend_reason()
    assert reason is not None and "terminal.backend=sandbox" in reason, reason
    assert "undo" in _slash()("help")
