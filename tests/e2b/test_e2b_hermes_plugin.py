"""The Hermes plugin ``e2b``: a real Hermes dispatching its terminal tool to a sandbox of the loopback
fake E2B through our generic provider, the key read from the profile and never shown."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.fakes.e2b import API_KEY, FakeE2B


@pytest.fixture
def hermes_home(fake: FakeE2B, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = Path(tempfile.mkdtemp(prefix="hse2b-", dir="/tmp"))
    config = {"terminal": {"backend": "e2b"},
              "plugins": {"enabled": ["e2b"], "entries": {"e2b": {"settings": {"name_prefix": "he2b"}}}}}
    (home / "config.yaml").write_text(yaml.safe_dump(config))
    (home / ".env").write_text(f"E2B_API_KEY={API_KEY}\n")
    monkeypatch.setenv("HERMES_HOME", str(home))
    monkeypatch.setenv("TERMINAL_ENV", "e2b")
    monkeypatch.setenv("TERMINAL_CONTAINER_PERSISTENT", "true")
    monkeypatch.setenv("E2B_API_URL", fake.url)
    monkeypatch.setenv("E2B_SANDBOX_URL", fake.url)
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    from hermes_cli.plugins import _reset_plugin_managers_for_tests, discover_plugins

    _reset_plugin_managers_for_tests()
    discover_plugins(force=True)
    try:
        yield home
    finally:
        from tools.terminal_tool import cleanup_all_environments

        cleanup_all_environments()
        for sandbox in fake.sandboxes():  # persistent: the test removes what it made
            fake.world.kill(sandbox)
        shutil.rmtree(home, ignore_errors=True)


def test_a_real_hermes_runs_its_terminal_tool_in_an_e2b_sandbox_with_checkpoints(fake: FakeE2B,
                                                                                 hermes_home: Path) -> None:
    from model_tools import handle_function_call

    def call(tool: str, args: dict[str, object]) -> dict[str, object]:
        result = json.loads(handle_function_call(tool, args, task_id="t-e2b"))
        assert isinstance(result, dict)
        return result

    ran = call("terminal", {"command": "echo hello > greeting; cat greeting; pwd"})
    assert ran["exit_code"] == 0 and str(ran["output"]).split() == ["hello", "/home/user"], ran
    assert len(fake.sandboxes()) == 1
    saved = call("sandbox_checkpoint", {"comment": "greeting written"})
    assert isinstance(saved["checkpoint"], str)
    call("terminal", {"command": "rm -f /home/user/greeting"})
    assert call("sandbox_restore", {"id": saved["checkpoint"]})["restored"] == saved["checkpoint"]
    assert str(call("terminal", {"command": "cat /home/user/greeting"})["output"]).strip() == "hello"
    listed = json.dumps(call("sandbox_checkpoints", {}))
    assert saved["checkpoint"] in listed and API_KEY not in listed


def test_a_command_with_a_long_deadline_gets_its_lease_before_it_starts(fake: FakeE2B, hermes_home: Path) -> None:
    from model_tools import handle_function_call

    def run(command: str, timeout: int) -> dict[str, object]:
        args = {"command": command, "timeout": timeout}
        result = json.loads(handle_function_call("terminal", args, task_id="t-e2b-lease"))
        assert isinstance(result, dict)
        return result

    assert run("echo warm", 30)["exit_code"] == 0  # the sandbox exists, its lease covers short commands
    fake.clear_requests()
    assert str(run("echo long-deadline", 500)["output"]).strip() == "long-deadline"
    order = [r.body.get("timeout") if r.path.endswith("/connect") else
             ("command" if r.rpc == "Process/Start" and "long-deadline" in json.dumps(r.body) else None)
             for r in fake.requests]
    order = [o for o in order if o is not None]
    # Hermes's deadline (500 s) plus the grace and headroom, secured before the command starts
    assert order[:2] == [500 + 1 + 30 + 30, "command"], order
    fake.clear_requests()
    assert run("echo short", 30)["exit_code"] == 0
    assert not [r for r in fake.requests if r.path.endswith("/connect")]  # covered: no request


def test_the_allow_setting_fences_the_sandbox_with_e2bs_egress_rules(fake: FakeE2B, hermes_home: Path) -> None:
    from model_tools import handle_function_call

    config = yaml.safe_load((hermes_home / "config.yaml").read_text())
    config["plugins"]["entries"]["e2b"]["settings"]["allow"] = ["@pypi", "*.internal.example"]
    (hermes_home / "config.yaml").write_text(yaml.safe_dump(config))
    result = json.loads(handle_function_call("terminal", {"command": "echo fenced"}, task_id="t-e2b-allow"))
    assert result["exit_code"] == 0 and result["output"].strip() == "fenced", result
    (create,) = fake.calls("POST", "/v2/sandboxes")
    assert create.body["network"] == {"allowOut": ["pypi.org", "files.pythonhosted.org", "*.internal.example"],
                                      "denyOut": ["0.0.0.0/0"]}
    assert create.body["metadata"]["hermes_sandboxes_network"] == "proxy"


def test_a_resumed_sandbox_takes_a_changed_allow_setting_but_keeps_a_change_made_from_the_shell(
        fake: FakeE2B, hermes_home: Path) -> None:
    """Each session resumes the task's E2B sandbox: an edited allow setting becomes its egress rules,
    a list changed with ``hermes sandbox network`` is kept and the session is warned once."""
    from model_tools import handle_function_call
    from tools.terminal_tool import cleanup_all_environments
    from tools.terminal_tool_lifecycle import get_active_env

    def session(allow: list[str]) -> str:
        cleanup_all_environments()  # the previous session ended
        config = yaml.safe_load((hermes_home / "config.yaml").read_text())
        config["plugins"]["entries"]["e2b"]["settings"]["allow"] = allow
        (hermes_home / "config.yaml").write_text(yaml.safe_dump(config))
        result = json.loads(handle_function_call("terminal", {"command": "echo ran"}, task_id="t-e2b-resume"))
        assert result["exit_code"] == 0 and result["output"].startswith("ran"), result
        return str(result["output"])

    def rules() -> list[str]:
        (sandbox,) = fake.sandboxes()
        return list(fake.sandbox(sandbox.sandbox_id).network["allowOut"])

    pypi = ["pypi.org", "files.pythonhosted.org"]
    assert session(["@pypi"]) == "ran" and rules() == pypi
    name = get_active_env("t-e2b-resume").sandbox_name
    told = session(["@pypi", "*.internal.example"])
    assert "the allow setting changed" in told and rules() == [*pypi, "*.internal.example"], told

    hermes = Path(sys.executable).parent / "hermes"
    done = subprocess.run([str(hermes), "sandbox", "network", "deny", "*.internal.example", "--sandbox", name],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == f"{name}: network proxy, allowed: @pypi\n", done  # text, as on the local backend
    assert rules() == pypi
    kept = session(["@pypi", "*.internal.example"])
    assert "changed outside this plugin's settings and is kept" in kept and rules() == pypi, kept
    assert session(["@pypi", "*.internal.example"]) == "ran"  # warned once
    assert rules() == pypi
