"""Settings refusal, the agent's checkpoint tools, automatic checkpoints, per-command credentials and
the audit log, all through a real Hermes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from hermes_sandboxes.recorder.journal import Journal
from hermes_sandboxes.recorder.state import HostState
from tests.cli.cli_kit import Pty

if TYPE_CHECKING:
    from tests.hermes.conftest import HermesHarness

HERMES_BIN = Path(sys.executable).parent / "hermes"
TOKEN = "flytok-1f2e3d4c5b6a"


def _status_full(hermes: HermesHarness) -> str:
    env = {**os.environ, "HERMES_HOME": str(hermes.home)}
    done = subprocess.run([str(HERMES_BIN), "status", "--full"], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    return done.stdout + done.stderr


@pytest.mark.parametrize(("settings_yaml", "key", "reason"), [
    ("name_prefix: 123", "settings.name_prefix", "123 was read as a number"),
    ("scope: sesion", "settings.scope", "'sesion' is not a scope"),
    ("memory: 2048", "settings.memory", "expected a size with a unit"),
    ("netwrok: host", "settings.netwrok", "unknown setting"),
])
def test_invalid_settings_refuse_with_the_key_and_reason_in_the_result_and_in_status(
    hermes: HermesHarness, settings_yaml: str, key: str, reason: str,
) -> None:
    hermes.write_config(
        "terminal:\n  backend: sandbox\nplugins:\n  enabled: [sandbox]\n  entries:\n    sandbox:\n"
        f"      settings:\n        {settings_yaml}\n")
    result = hermes.run("echo should-not-run")
    assert "should-not-run" not in result.get("output", "")
    assert f"plugins.entries.sandbox.{key}" in result["error"] and reason in result["error"]
    assert hermes.sandbox_names() == []
    if key.endswith("name_prefix"):  # one full `hermes status --full` run is enough (it takes seconds)
        status = _status_full(hermes)
        assert "Local sandbox settings" in status and f"plugins.entries.sandbox.{key}" in status


def test_an_unparseable_config_refuses_instead_of_running_on_defaults(hermes: HermesHarness) -> None:
    hermes.write_config("terminal:\n  backend: sandbox\nplugins: [unclosed\n")
    result = hermes.run("echo should-not-run")
    assert "cannot be parsed" in result["error"] and "config.yaml" in result["error"]


def test_null_clears_a_setting_and_off_means_off(hermes: HermesHarness) -> None:
    hermes.write_config(
        "terminal:\n  backend: sandbox\nplugins:\n  enabled: [sandbox]\n  entries:\n    sandbox:\n"
        f"      settings:\n        name_prefix: {hermes.prefix}\n        scope: null\n        auto_checkpoint: off\n")
    result = hermes.run("rm -rf /root/anything")
    assert result["exit_code"] == 0 and "checkpoint" not in result["output"]
    assert hermes.env().recorded.policy == "off"


def test_the_agent_checkpoints_diffs_and_restores_its_own_sandbox(hermes: HermesHarness) -> None:
    hermes.run("mkdir -p /root/app && echo v1 > /root/app/main.py")
    saved = hermes.call("sandbox_checkpoint", {"comment": "v1 works"})
    checkpoint_id = saved["checkpoint"]
    assert "sandbox_restore" in saved["message"]
    hermes.run("echo v2-broken > /root/app/main.py && touch /root/app/new.py")

    diff = hermes.call("sandbox_diff", {"id": checkpoint_id})
    changed = {c["path"]: c["change"] for c in diff["changes"]}
    assert changed.get("/root/app/main.py") == "modified" and changed.get("/root/app/new.py") == "added"

    listed = hermes.call("sandbox_checkpoints", {})
    assert [c["id"] for c in listed["checkpoints"]] == [checkpoint_id]
    assert listed["checkpoints"][0]["trigger"] == "agent"

    restored = hermes.call("sandbox_restore", {"id": checkpoint_id})
    assert restored["restored"] == checkpoint_id
    assert any("v2-broken" in c for c in restored["discarded_commands"])
    assert hermes.run("cat /root/app/main.py; ls /root/app")["output"].split() == ["v1", "main.py"]

    missing = hermes.call("sandbox_restore", {"id": "ck-nope"})
    assert "ck-nope" in missing["error"]


def test_a_risky_command_is_preceded_by_a_checkpoint_the_model_can_restore(hermes: HermesHarness) -> None:
    hermes.run("mkdir -p /root/data && echo precious > /root/data/db")
    result = hermes.run("rm -rf /root/data")
    note = result["output"]
    assert "checkpoint" in note and "sandbox_restore" in note
    checkpoint_id = note.split("checkpoint ")[1].split()[0]
    assert hermes.run("cat /root/data/db")["exit_code"] != 0
    assert hermes.call("sandbox_restore", {"id": checkpoint_id})["restored"] == checkpoint_id
    assert hermes.run("cat /root/data/db")["output"].strip() == "precious"
    story = hermes.call("sandbox_checkpoints", {})["checkpoints"][0]
    assert story["trigger"] == "auto" and story["trigger_command"] == "rm -rf /root/data"


def _install_fake_flyctl(hermes: HermesHarness) -> None:
    script = '#!/bin/sh\\necho "token=$FLY_API_TOKEN length=${#FLY_API_TOKEN}"\\n'
    assert hermes.run(f"printf '{script}' > /usr/local/bin/flyctl && chmod +x /usr/local/bin/flyctl")[
        "exit_code"] == 0


def test_a_mapped_secret_reaches_only_the_command_that_runs_its_program(hermes: HermesHarness) -> None:
    (hermes.home / ".env").write_text(f"FLY_API_TOKEN={TOKEN}\n")
    hermes.configure(credentials={"flyctl": "FLY_API_TOKEN"})
    _install_fake_flyctl(hermes)

    result = hermes.run("flyctl deploy")
    assert TOKEN not in json.dumps(result)
    assert f"token=[REDACTED:FLY_API_TOKEN] length={len(TOKEN)}" in result["output"]

    assert hermes.run("echo ${FLY_API_TOKEN:-unset}")["output"].strip() == "unset"
    assert hermes.run("echo flyctl; env | grep -c FLY_API_TOKEN || true")["output"].split()[-1] == "0"
    # never on the sandbox's disk: Hermes's shell snapshot leaves the name out
    assert hermes.run("grep -rl FLY_API_TOKEN /tmp /root 2>/dev/null | wc -l")["output"].strip() == "0"

    audit = HostState().audit_path(hermes.backend.key).read_text()
    assert TOKEN not in audit
    records = [json.loads(line) for line in audit.splitlines() if hermes.prefix in line]
    flyctl = [r for r in records if r.get("command") == "flyctl deploy"]
    assert flyctl and flyctl[0]["origin"]["credentials"] == "FLY_API_TOKEN"


def test_a_missing_secret_is_reported_and_the_command_runs_without_it(hermes: HermesHarness) -> None:
    hermes.configure(credentials={"flyctl": "FLY_API_TOKEN_NOT_SET"})
    _install_fake_flyctl(hermes)
    result = hermes.run("flyctl status")
    assert "length=0" in result["output"]
    assert "FLY_API_TOKEN_NOT_SET is not set in this Hermes profile" in result["output"]


def test_every_command_lands_in_the_audit_log_with_its_task_and_session(
    hermes: HermesHarness, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HERMES_SESSION_KEY", "a")
    hermes.run("echo audited", task_id="turn-7")
    # (through the journal's reader: a CLI another test killed with -9 mid-write may have left a torn line)
    records = [r.to_dict() for r in Journal(HostState().audit_path(hermes.backend.key)).records()]
    mine = [r for r in records if r.get("type") == "exec" and r.get("command") == "echo audited"
            and r["sandbox"].startswith(hermes.prefix)]
    assert mine and mine[-1]["origin"]["session"] == "a" and mine[-1]["origin"]["task"] == "session:a"
    assert mine[-1]["exit_code"] == 0


def _hermes_sandbox(hermes: HermesHarness, *words: str) -> subprocess.CompletedProcess[str]:
    """The real ``hermes sandbox ...`` on the test's profile, with no terminal."""
    return subprocess.run([str(HERMES_BIN), "sandbox", *words], env={**os.environ, "HERMES_HOME": str(hermes.home)},
                          capture_output=True, text=True, timeout=120, check=False, stdin=subprocess.DEVNULL)


def _succeeds(hermes: HermesHarness, *words: str) -> subprocess.CompletedProcess[str]:
    done = _hermes_sandbox(hermes, *words)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done
    return done


def _agent_and_a_change(hermes: HermesHarness) -> str:
    """A checkpoint the agent took, then one command that changed a file: its id."""
    hermes.run("echo x > /root/x")
    checkpoint_id = str(hermes.call("sandbox_checkpoint", {"comment": "from the agent"})["checkpoint"])
    hermes.run("echo changed > /root/x")
    return checkpoint_id


def test_hermes_sandbox_json_gives_what_the_agent_tools_answer(hermes: HermesHarness) -> None:
    checkpoint_id = _agent_and_a_change(hermes)
    name = hermes.env().sandbox_name

    def cli(*words: str) -> Any:
        return json.loads(_succeeds(hermes, *words, "--json").stdout)

    assert [s["name"] for s in cli("list")] == [name]
    # one output model: the same dict the agent's tool answers with, field for field
    assert cli("checkpoints") == hermes.call("sandbox_checkpoints", {})
    diff = cli("diff", checkpoint_id)
    assert diff == hermes.call("sandbox_diff", {"id": checkpoint_id})
    rows = {row["path"]: row for row in diff["summary"]["rows"]}  # /tmp holds Hermes's own cwd file
    assert (rows["/root"]["files"], rows["/root"]["modified"]) == (1, 1)
    assert [c["command"] for c in diff["commands"]][-1] == "echo changed > /root/x"
    restored = cli("restore", checkpoint_id, "--yes")
    assert hermes.run("cat /root/x")["output"].strip() == "x"
    again = hermes.call("sandbox_restore", {"id": checkpoint_id})
    assert set(restored) == set(again) and restored["restored"] == again["restored"] == checkpoint_id
    # the discarded commands a list in both, as the tool gives them
    assert restored["discarded_commands"][-1] == "echo changed > /root/x", restored
    assert isinstance(again["discarded_commands"], list), again
    assert cli("network", "show") == {"sandbox": name, "network": hermes.env().recorded.inner.info().spec.network,
                                      "allow": []}


def test_hermes_sandbox_prints_text_by_default_as_hermes_sandboxes_does(hermes: HermesHarness) -> None:
    checkpoint_id = _agent_and_a_change(hermes)
    name = hermes.env().sandbox_name

    listed = _succeeds(hermes, "list").stdout.splitlines()
    assert listed[0].split() == ["NAME", "STATE", "KIND", "AGE", "NETWORK", "CHANGED", "CHECKPOINTS"], listed
    assert len(listed) == 2 and listed[1].split()[:3] == [name, "running", "persistent"], listed
    assert listed[1].split()[-1] == "1", listed  # its one checkpoint

    shown = _succeeds(hermes, "checkpoints").stdout.splitlines()
    assert shown[0] == f"checkpoints of {name}, newest first", shown
    assert shown[1].split() == ["ID", "AGE", "TRIGGER", "COMMENT", "COMMANDS", "SIZE", "HEALTH"], shown
    newest = shown[2]
    assert newest.startswith(checkpoint_id) and " agent " in newest and "from the agent" in newest, shown
    assert not shown[0].startswith("{"), shown  # not JSON

    diff = _succeeds(hermes, "diff", checkpoint_id).stdout.splitlines()
    assert diff[0] == f"changes from {checkpoint_id} to now", diff
    assert diff[1].split() == ["DIRECTORY", "FILES", "ADDED", "MODIFIED", "DELETED", "NET", "SIZE"], diff
    assert ["/root", "1", "0", "1", "0"] in [line.split()[:5] for line in diff], diff
    assert any(line.split()[0] == "total" for line in diff), diff
    since = diff.index(f"commands since {checkpoint_id}")
    assert diff[since + 1].split() == ["EXIT", "COMMAND"] and diff[-1].split() == ["0", "echo", "changed", ">",
                                                                                     "/root/x"], diff

    restored = _succeeds(hermes, "restore", checkpoint_id, "--yes")
    lines = restored.stdout.splitlines()
    assert lines[0].startswith(f"restored {name} to {checkpoint_id}, discarding ") and lines[0].endswith(
        " command(s):"), lines
    assert "  echo changed > /root/x" in lines, lines
    assert "processes that were running were stopped" in restored.stderr, restored
    assert hermes.run("cat /root/x")["output"].strip() == "x"

    network = _succeeds(hermes, "network", "show").stdout
    mode = hermes.env().recorded.inner.info().spec.network
    assert network.startswith(f"{name}: network {mode} ("), network  # the line hermes-sandboxes network show prints


def test_hermes_sandbox_says_how_many_commands_it_left_out(hermes: HermesHarness) -> None:
    hermes.run("true")
    checkpoint_id = str(hermes.call("sandbox_checkpoint", {"comment": "before many"})["checkpoint"])
    for i in range(22):
        hermes.run(f"echo {i} > /root/n")
    diff = json.loads(_succeeds(hermes, "diff", checkpoint_id, "--json").stdout)
    assert [c["command"] for c in diff["commands"]] == [f"echo {i} > /root/n" for i in range(12, 22)], diff
    assert diff["earlier_commands_omitted"] == 12, diff
    assert diff == hermes.call("sandbox_diff", {"id": checkpoint_id})
    text = _succeeds(hermes, "diff", checkpoint_id).stdout.splitlines()
    assert f"commands since {checkpoint_id} (the last 10; 12 earlier not shown)" in text, text
    restored = _succeeds(hermes, "restore", checkpoint_id, "--yes").stdout.splitlines()
    # the journal's count, the last 20 listed
    assert restored[:3] == [f"restored {hermes.env().sandbox_name} to {checkpoint_id}, discarding 22 command(s):",
                            "  … 2 earlier", "  echo 2 > /root/n"], restored
    assert restored[-1] == "  echo 21 > /root/n" and len(restored) == 22, restored


def test_hermes_sandbox_exits_as_hermes_sandboxes_does(hermes: HermesHarness) -> None:
    from tests.cli.cli_kit import hs

    hermes.run("echo x > /root/x")
    checkpoint_id = str(hermes.call("sandbox_checkpoint", {"comment": "kept"})["checkpoint"])
    name = hermes.env().sandbox_name

    def refused(code: int, *words: str, says: str) -> None:
        done = _hermes_sandbox(hermes, *words)
        assert done.returncode == code and done.stdout == "" and "Traceback" not in done.stderr, done
        assert says in done.stderr, (says, done.stderr)

    # bad usage, 2: what argparse refuses, a missing HOST, a restore nobody can confirm
    refused(2, says="usage:")  # no subcommand
    refused(2, "diff", says="the following arguments are required: checkpoint")
    refused(2, "checkpoints", "--jsn", says="unrecognized arguments: --jsn")
    refused(2, "network", "allow", says="error: network allow needs at least one HOST entry")
    for json_flag in ((), ("--json",)):
        refused(2, "restore", checkpoint_id, *json_flag, says="--yes")
        # an error, 1, in either output mode: one line on stderr, nothing on stdout
        refused(1, "diff", "ck-nope", *json_flag,
                says=f"error: sandbox {name} has no checkpoint 'ck-nope'; list them with: hermes sandbox checkpoints")
    refused(1, "checkpoints", "--sandbox", "someone-else", says="outside this plugin's name_prefix")
    refused(1, "checkpoints", "--sandbox", f"{hermes.prefix}-nope", says="error: ")
    # the same codes as hermes-sandboxes for the same refusals
    assert hs(hermes.backend.home, "checkpoint", "diff", name, "ck-nope").exit_code == 1
    assert hs(hermes.backend.home, "checkpoint", "restore", name, checkpoint_id).exit_code == 2
    assert hermes.run("cat /root/x")["output"].strip() == "x"  # nothing was restored

    hermes.run("echo changed > /root/x")
    term = Pty([str(HERMES_BIN), "sandbox", "restore", checkpoint_id])  # on a terminal: the preview, a question
    term.expect(b"throws away")
    term.expect(b"echo changed > /root/x")
    term.expect(b"[y/N]")
    term.send(b"n\r")
    # (the error in red on a terminal, as hermes-sandboxes writes it)
    assert term.finish() == 1 and b"error:\x1b[0m restore cancelled; nothing was changed" in term.seen, term.seen
    assert hermes.run("cat /root/x")["output"].strip() == "changed"
    hermes.configure(scope="sesion")  # a setting hermes-sandboxes would refuse in its config file: exit 1 there too
    refused(1, "list", says="error: plugins.entries.sandbox.settings.scope")


def test_an_unknown_checkpoint_points_the_model_to_its_own_tool(hermes: HermesHarness) -> None:
    hermes.run("echo x > /root/x")
    for tool in ("sandbox_restore", "sandbox_diff"):
        error = hermes.call(tool, {"id": "ck-nope"})["error"]
        assert "has no checkpoint 'ck-nope'; list them with the sandbox_checkpoints tool" in error, error
        assert "hermes-sandboxes" not in error, error  # the host's CLI: the model cannot run it


def test_the_dashboard_probe_and_setup_instructions_tell_what_is_missing(hermes: HermesHarness) -> None:
    from hermes_sandboxes.hermes.providers.local import LocalProvider

    provider = LocalProvider()
    assert provider.probe() == ("ready", "")
    hermes.configure(scope="sesion")
    status, detail = provider.probe()
    assert status == "needs_setup" and "scope" in detail
    text = " ".join(provider.setup_instructions())
    assert "plugins.enabled" in text and "root" in text


def test_a_failed_file_sync_never_runs_the_command_against_stale_state(
    hermes: HermesHarness, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HERMES_FORCE_FILE_SYNC", "1")
    (hermes.home / "skills" / "s").mkdir(parents=True)
    (hermes.home / "skills" / "s" / "SKILL.md").write_text("v1\n")
    assert hermes.run("cat /root/.hermes/skills/s/SKILL.md")["output"].strip() == "v1"
    # the agent turns the skill's path into a directory: the next push cannot write it
    hermes.run("rm /root/.hermes/skills/s/SKILL.md && mkdir /root/.hermes/skills/s/SKILL.md")
    (hermes.home / "skills" / "s" / "SKILL.md").write_text("v2 from the host\n")
    result = hermes.run("touch /root/ran")  # refused (Hermes retries it three times first)
    assert "file sync" in json.dumps(result)
    # every command is refused until the sandbox can take the push again: repair it from outside
    assert hermes.env().sandbox.exec(["rmdir", "/root/.hermes/skills/s/SKILL.md"]).exit_code == 0
    assert hermes.run("ls /root/ran")["exit_code"] != 0
    assert hermes.run("cat /root/.hermes/skills/s/SKILL.md")["output"].strip() == "v2 from the host"


def test_a_configured_health_command_is_part_of_the_agents_checkpoint_story(hermes: HermesHarness) -> None:
    hermes.configure(health_command="test -f /root/built")
    hermes.run("touch /root/built")
    taken = hermes.call("sandbox_checkpoint", {"comment": "built"})["checkpoint"]
    listed = hermes.call("sandbox_checkpoints", {})
    [story] = [c for c in listed["checkpoints"] if c["id"] == taken]
    assert story["health"]["passed"] is True and story["health"]["command"] == "test -f /root/built"


def test_after_a_restore_made_with_the_cli_the_running_session_resyncs_what_differs(
    hermes: HermesHarness, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HERMES_FORCE_FILE_SYNC", "1")
    for i in range(3):
        (hermes.home / "skills" / f"s{i}").mkdir(parents=True)
        (hermes.home / "skills" / f"s{i}" / "SKILL.md").write_text(f"v1 {i}\n")
    stamp = "stat -c %y /root/.hermes/skills/s0/SKILL.md"
    pushed = hermes.run(stamp)["output"]
    saved = hermes.call("sandbox_checkpoint", {"comment": "skills at v1"})["checkpoint"]
    (hermes.home / "skills" / "s1" / "SKILL.md").write_text("v2 1\n")
    assert hermes.run("cat /root/.hermes/skills/s1/SKILL.md")["output"].strip() == "v2 1"

    done = subprocess.run([sys.executable, "-m", "hermes_sandboxes.cli", "--home", str(hermes.backend.home),
                           "checkpoint", "restore", hermes.env().sandbox_name, saved, "--yes"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    # the session's next command finds the restore noted: ~/.hermes is brought up to date again,
    # sending only what differs (the unchanged skill is the checkpoint's own file, not a new copy)
    assert hermes.run("cat /root/.hermes/skills/s1/SKILL.md")["output"].strip() == "v2 1"
    assert hermes.run(stamp)["output"] == pushed
