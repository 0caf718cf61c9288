"""Which sandbox a Hermes task gets: CLI and cron share, gateway sessions do not, delegates follow
their parent, profiles never meet, and non-persistent runs get sandboxes that die with them."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml

if TYPE_CHECKING:
    from tests.hermes.conftest import HermesHarness


def test_cli_and_cron_tasks_share_the_profiles_default_sandbox(hermes: HermesHarness) -> None:
    hermes.run("echo from-cli > /root/shared", task_id="cli-run")
    assert hermes.run("cat /root/shared", task_id="cron-job")["output"].strip() == "from-cli"
    assert hermes.env("cli-run").sandbox_name == hermes.env("cron-job").sandbox_name
    assert len(hermes.sandbox_names()) == 1


def test_two_gateway_sessions_get_two_sandboxes(hermes: HermesHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERMES_SESSION_KEY", "a")
    hermes.run("echo session-a > /root/mine", task_id="turn-a")
    name_a = hermes.env("turn-a").sandbox_name
    monkeypatch.setenv("HERMES_SESSION_KEY", "b")
    assert hermes.run("cat /root/mine", task_id="turn-b")["exit_code"] != 0
    name_b = hermes.env("turn-b").sandbox_name
    assert name_a != name_b
    assert {name_a, name_b} == set(hermes.sandbox_names())


def test_a_delegate_child_shares_its_parents_sandbox(hermes: HermesHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERMES_SESSION_KEY", "a")
    hermes.run("echo parent > /root/note", task_id="parent")
    # delegate_task children run under the parent's session with their own task id
    assert hermes.run("cat /root/note", task_id="child-1")["output"].strip() == "parent"
    assert hermes.env("child-1").sandbox_name == hermes.env("parent").sandbox_name


def test_instance_scope_puts_every_session_in_one_sandbox(
    hermes: HermesHarness, monkeypatch: pytest.MonkeyPatch,
) -> None:
    hermes.configure(scope="instance")
    monkeypatch.setenv("HERMES_SESSION_KEY", "a")
    hermes.run("echo one > /root/f", task_id="x")
    monkeypatch.setenv("HERMES_SESSION_KEY", "b")
    assert hermes.run("cat /root/f", task_id="y")["output"].strip() == "one"
    assert len(hermes.sandbox_names()) == 1


def test_non_persistent_runs_get_run_unique_sandboxes_destroyed_on_cleanup(hermes: HermesHarness) -> None:
    from tools.terminal_tool import register_container_alias
    from tools.terminal_tool_lifecycle import cleanup_vm

    hermes.persistent(False)
    hermes.run("echo mine > /root/f", task_id="run-1")
    first = hermes.env("run-1")
    assert first.sandbox_name.startswith(hermes.prefix + "-tmp-")
    assert hermes.backend.get(first.sandbox_name).ephemeral
    register_container_alias("run-1-child", "run-1")
    assert hermes.run("cat /root/f", task_id="run-1-child")["output"].strip() == "mine"
    second = hermes.run("cat /root/f", task_id="run-2")
    assert second["exit_code"] != 0  # another run never sees this run's files
    assert hermes.env("run-2").sandbox_name != first.sandbox_name
    cleanup_vm("run-1")
    cleanup_vm("run-2")
    assert hermes.sandbox_names() == []


def test_two_profiles_never_share_a_sandbox(hermes: HermesHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    from hermes_cli.plugins import _reset_plugin_managers_for_tests, discover_plugins

    hermes.run("echo profile-one > /root/who")
    first = hermes.env().sandbox_name
    hermes.cleanup_environments()
    other = Path(tempfile.mkdtemp(prefix="home-", dir=hermes.home.parent))
    try:
        shutil.copy(hermes.home / "config.yaml", other / "config.yaml")  # same prefix, same task id
        monkeypatch.setenv("HERMES_HOME", str(other))
        _reset_plugin_managers_for_tests()
        discover_plugins(force=True)
        assert hermes.run("cat /root/who")["exit_code"] != 0
        assert hermes.env().sandbox_name != first
        assert len(hermes.sandbox_names()) == 2
    finally:
        hermes.cleanup_environments()
        shutil.rmtree(other, ignore_errors=True)


def test_file_sync_pushes_skills_and_credentials_and_pulls_back_only_skills(hermes: HermesHarness) -> None:
    (hermes.home / "skills" / "greet").mkdir(parents=True)
    (hermes.home / "skills" / "greet" / "SKILL.md").write_text("# greet\nsay hello\n")
    (hermes.home / "token.json").write_text('{"token": "host-copy"}')
    config = yaml.safe_load((hermes.home / "config.yaml").read_text())
    config["terminal"]["credential_files"] = ["token.json"]
    (hermes.home / "config.yaml").write_text(yaml.safe_dump(config))

    seen = hermes.run("cat /root/.hermes/skills/greet/SKILL.md /root/.hermes/token.json; "
                      "stat -c %a /root/.hermes/token.json")["output"]
    assert "say hello" in seen and "host-copy" in seen
    assert seen.strip().endswith("600")  # credential files are private in the sandbox too
    # Hermes maps a new sandbox file back to the host through a known sibling, so the agent's new
    # note lands next to the skill it belongs to; the edited skill comes back too.
    hermes.run("echo 'say hello, politely' > /root/.hermes/skills/greet/SKILL.md"
               " && echo learned > /root/.hermes/skills/greet/notes.md"
               " && echo '{\"token\": \"tampered\"}' > /root/.hermes/token.json")
    hermes.cleanup_environments()  # teardown pulls agent-authored changes back
    assert (hermes.home / "skills" / "greet" / "SKILL.md").read_text() == "say hello, politely\n"
    assert (hermes.home / "skills" / "greet" / "notes.md").read_text() == "learned\n"
    assert "host-copy" in (hermes.home / "token.json").read_text()


def test_a_host_change_reaches_the_sandbox_before_the_next_command(
    hermes: HermesHarness, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HERMES_FORCE_FILE_SYNC", "1")  # skip Hermes's 5 s sync throttle
    (hermes.home / "skills" / "a").mkdir(parents=True)
    (hermes.home / "skills" / "a" / "SKILL.md").write_text("v1\n")
    assert hermes.run("cat /root/.hermes/skills/a/SKILL.md")["output"].strip() == "v1"
    (hermes.home / "skills" / "a" / "SKILL.md").write_text("v2, longer\n")
    os.utime(hermes.home / "skills" / "a" / "SKILL.md", (1, 1))
    assert hermes.run("cat /root/.hermes/skills/a/SKILL.md")["output"].strip() == "v2, longer"
