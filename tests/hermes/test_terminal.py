"""Hermes's own terminal tool, dispatched into the local sandbox through the plugin."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from tests.local.kit import wait_for
from tests.patience import until_started

if TYPE_CHECKING:
    from tests.hermes.conftest import HermesHarness


def test_the_plugin_is_discovered_through_its_entry_point(hermes: HermesHarness) -> None:
    from agent.terminal_env_registry import get_provider, provider_flag
    from hermes_cli.plugins import get_plugin_manager

    loaded = get_plugin_manager()._plugins["sandbox"]
    assert loaded.enabled and loaded.error is None
    assert set(loaded.tools_registered) == {
        "sandbox_checkpoint", "sandbox_checkpoints", "sandbox_restore", "sandbox_diff"}
    assert get_provider("sandbox") is not None
    assert provider_flag("sandbox", "is_container") is True
    assert provider_flag("sandbox", "skip_container_guards", True) is False
    assert provider_flag("sandbox", "session_isolated_when_nonpersistent") is True
    assert "E2B_API_KEY" in provider_flag("sandbox", "strip_env_keys")


def test_a_command_runs_in_the_sandbox_and_its_exit_code_reaches_hermes(hermes: HermesHarness) -> None:
    result = hermes.run("echo hello from $(hostname); exit 3")
    assert result["exit_code"] == 3
    assert result["output"].startswith("hello from " + hermes.prefix)
    assert hermes.env().sandbox_name.startswith(hermes.prefix + "-default-")
    # the host's /root is masked: a file there is not visible in the sandbox
    assert hermes.run("ls -A /root | wc -l")["output"].strip() == "0"


def test_files_and_cwd_persist_across_calls_and_sessions(hermes: HermesHarness) -> None:
    hermes.run("mkdir -p /root/work && cd /root/work && echo 42 > answer")
    assert hermes.run("pwd")["output"].strip() == "/root/work"
    assert hermes.run("cat answer")["exit_code"] == 0
    name = hermes.env().sandbox_name
    hermes.cleanup_environments()  # Hermes exits or reaps the idle environment
    assert hermes.run("cat /root/work/answer")["output"].strip() == "42"
    assert hermes.env().sandbox_name == name


def test_output_streams_so_a_timed_out_command_keeps_what_it_printed(hermes: HermesHarness) -> None:
    result = until_started(lambda timeout: hermes.run("echo before-the-wait; sleep 60; echo never",
                                                      timeout=max(1, round(timeout))),
                           lambda result: "before-the-wait" in result["output"], first=2)
    assert result["exit_code"] == 124, result
    assert "before-the-wait" in result["output"] and "never" not in result["output"]


def _write_script(hermes: HermesHarness, path: str, text: str) -> None:
    import base64

    encoded = base64.b64encode(text.encode()).decode()
    assert hermes.run(f"echo {encoded} | base64 -d > {path}")["exit_code"] == 0


def test_a_timeout_kills_the_commands_whole_tree_but_the_sandbox_survives(hermes: HermesHarness) -> None:
    _write_script(hermes, "/root/tree.sh",  # each part says it started: the kill must find all three
                  "setsid sh -c 'echo one; exec sleep 1001' < /dev/null 2>&1 &\n"
                  "( sh -c 'echo two; exec sleep 1002' & wait ) &\necho three; sleep 1003\n")
    result = until_started(lambda timeout: hermes.run("bash /root/tree.sh", timeout=max(1, round(timeout))),
                           lambda result: set(result["output"].split()) >= {"one", "two", "three"}, first=2)
    assert result["exit_code"] == 124
    survivors = hermes.run("ps -eo args | grep '^sleep 100' || true")["output"]
    assert survivors.strip() == ""  # the timeout's kill is complete when the command's result is back
    assert hermes.run("echo still here")["output"].strip() == "still here"


def test_an_interrupt_kills_the_command_and_reports_130(hermes: HermesHarness) -> None:
    from tools.interrupt import set_interrupt

    hermes.run("true")  # bring the environment up first
    _write_script(hermes, "/root/spin.sh", "sleep 1004 &\nsleep 1005\n")
    box: dict[str, object] = {}

    def call() -> None:
        box["tid"] = threading.get_ident()
        box["result"] = hermes.run("bash /root/spin.sh", timeout=60)

    worker = threading.Thread(target=call)
    worker.start()
    sandbox = hermes.backend.get(hermes.env().sandbox_name)
    wait_for(lambda: "sleep 1005" in sandbox.exec("ps -eo args").stdout, "the command to be running", 120)
    set_interrupt(True, box["tid"])
    worker.join(20)
    set_interrupt(False, box["tid"])
    assert not worker.is_alive()
    assert box["result"]["exit_code"] == 130  # type: ignore[index]
    assert hermes.run("ps -eo args | grep '^sleep 100' || true")["output"].strip() == ""
