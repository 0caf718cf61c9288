"""The cleanup table through a real Hermes on the loopback fake E2B: cleanup asked for during a
command waits for it, a repeated cleanup and one for a vanished sandbox do nothing, Ctrl-C during
the pull-back still destroys an ephemeral sandbox and is raised again, a finalised environment never
pulls, and a persistent sandbox is never paused or killed by us."""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.e2b import FakeE2B
from tests.interrupts import sigint_raises

pytest_plugins = ["tests.e2b.test_e2b_hermes_plugin"]  # its hermes_home fixture: one profile, one key


def run(command: str, task: str) -> dict[str, Any]:
    from model_tools import handle_function_call

    result: dict[str, Any] = json.loads(handle_function_call("terminal", {"command": command}, task_id=task))
    return result


def environment(task: str) -> Any:
    from tools.terminal_tool_lifecycle import get_active_env

    env = get_active_env(task)
    assert env is not None, f"no environment for {task}"
    return env


def wait_until(predicate: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _sandbox_id(env: Any) -> str:
    """The E2B id of the sandbox a Hermes environment of the e2b plugin runs on."""
    from hermes_sandboxes.backends.e2b.sandbox import E2BSandbox

    assert isinstance(env.sandbox, E2BSandbox)
    return env.sandbox.sandbox_id


def lifecycle_calls(fake: FakeE2B, sandbox_id: str) -> list[str]:
    """Requests that would pause or kill the sandbox."""
    return [f"{r.method} {r.path}" for r in fake.requests if r.sandbox_id == sandbox_id
            and (r.method == "DELETE" or r.path.endswith("/pause") or r.path.endswith("/timeout"))]


@pytest.fixture
def ephemeral(monkeypatch: pytest.MonkeyPatch, hermes_home: Path) -> Iterator[Path]:
    monkeypatch.setenv("TERMINAL_CONTAINER_PERSISTENT", "false")
    yield hermes_home


def test_cleanup_during_a_command_is_deferred_until_it_ends(fake: FakeE2B, ephemeral: Path) -> None:
    assert run("echo up", "t-defer")["exit_code"] == 0
    env = environment("t-defer")
    sandbox_id = _sandbox_id(env)
    results: list[dict[str, Any]] = []
    worker = threading.Thread(target=lambda: results.append(
        run("while [ ! -e /tmp/go ]; do sleep 0.05; done; echo finished", "t-defer")))
    worker.start()
    try:
        wait_until(lambda: any("/tmp/go" in json.dumps(r.body) for r in fake.calls(rpc="Process/Start")),
                   "the command to start")
        env.cleanup()  # e.g. the idle reaper, while the command runs
        env.cleanup()  # and again: nothing more
        assert not lifecycle_calls(fake, sandbox_id) and fake.sandbox(sandbox_id).state == "running"
        assert not env.wait_for_cleanup(0)  # still pending
    finally:
        fake.sandbox(sandbox_id).local.write_file("/tmp/go", b"")
        worker.join(120)
    assert results and "finished" in results[0]["output"], results  # the command ran to its end
    assert env.wait_for_cleanup(120)
    assert lifecycle_calls(fake, sandbox_id) == [f"DELETE /sandboxes/{sandbox_id}"]  # then it was destroyed
    from tools.environments.base import EnvironmentConnectionError

    with pytest.raises(EnvironmentConnectionError, match="cleaned up"):
        env.execute("echo late")


@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "ephemeral"])
def test_cleanup_of_a_vanished_sandbox_and_a_repeated_cleanup_do_nothing(
        fake: FakeE2B, hermes_home: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        persistent: bool) -> None:
    monkeypatch.setenv("TERMINAL_CONTAINER_PERSISTENT", "true" if persistent else "false")
    (hermes_home / "skills" / "s").mkdir(parents=True)
    (hermes_home / "skills" / "s" / "SKILL.md").write_text("a skill\n")  # so there is state to pull
    assert run("echo up", "t-gone")["exit_code"] == 0
    env = environment("t-gone")
    fake.world.kill(fake.sandbox(_sandbox_id(env)))  # deleted behind our back (dashboard, CLI)
    with caplog.at_level(logging.INFO):
        env.cleanup()
        env.cleanup()
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert not loud, [r.getMessage() for r in loud]  # no warning, no traceback, no sync-back retries
    assert "already gone" in caplog.text


def test_ctrl_c_during_the_pull_back_still_destroys_the_sandbox_and_is_raised_again(
        fake: FakeE2B, ephemeral: Path) -> None:
    (ephemeral / "skills" / "s").mkdir(parents=True)
    (ephemeral / "skills" / "s" / "SKILL.md").write_text("a skill\n")
    assert run("echo up", "t-int")["exit_code"] == 0
    env = environment("t-int")
    sandbox_id = _sandbox_id(env)
    lease = env.options.lease
    assert lease is not None and lease.is_writer
    # Ctrl-C arrives while the pull-back's download is under way (Hermes holds it to the attempt's end)
    fake.call_on("POST", "/process.Process/Start", lambda: os.kill(os.getpid(), signal.SIGINT))
    with sigint_raises(), pytest.raises(KeyboardInterrupt):
        env.cleanup()
    assert lifecycle_calls(fake, sandbox_id) == [f"DELETE /sandboxes/{sandbox_id}"]  # destroyed all the same
    assert not lease.is_writer  # and the lease released


@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "ephemeral"])
def test_a_finalised_environment_never_pulls_and_only_an_ephemeral_sandbox_is_destroyed(
        fake: FakeE2B, hermes_home: Path, persistent: bool) -> None:
    from hermes_sandboxes.hermes.providers.e2b import E2BProvider

    provider = E2BProvider()
    env = provider.create_environment(cwd="", timeout=60, task_id="t-final",
                                      container_config={"container_persistent": persistent})
    assert env.execute("echo hi")["output"].strip() == "hi"
    sandbox_id = _sandbox_id(env)
    fake.clear_requests()
    del env
    gc.collect()
    assert not fake.calls(rpc="Process/Start")  # nothing pulled
    if persistent:
        assert not lifecycle_calls(fake, sandbox_id) and fake.sandbox(sandbox_id).state == "running"
        again = provider.create_environment(cwd="", timeout=60, task_id="t-final",
                                            container_config={"container_persistent": True})
        try:
            assert _sandbox_id(again) == sandbox_id
            assert again.options.lease is not None and again.options.lease.is_writer  # released on finalising
        finally:
            again.cleanup()
    else:
        assert lifecycle_calls(fake, sandbox_id) == [f"DELETE /sandboxes/{sandbox_id}"]


def test_a_persistent_sandbox_is_never_paused_or_killed_by_cleanup(fake: FakeE2B, hermes_home: Path) -> None:
    assert run("echo up", "t-keep")["exit_code"] == 0
    env = environment("t-keep")
    sandbox_id = _sandbox_id(env)
    fake.clear_requests()
    env.cleanup()
    assert not lifecycle_calls(fake, sandbox_id) and fake.sandbox(sandbox_id).state == "running"


def test_a_persistent_sandbox_e2b_paused_is_resumed_for_the_pull_back_and_left_to_pause_again(
        fake: FakeE2B, hermes_home: Path) -> None:
    (hermes_home / "skills" / "s").mkdir(parents=True)
    (hermes_home / "skills" / "s" / "SKILL.md").write_text("a skill\n")
    assert run("echo from-the-agent > ~/.hermes/skills/s/SKILL.md", "t-paused")["exit_code"] == 0
    env = environment("t-paused")
    sandbox_id = _sandbox_id(env)
    fake.pause(sandbox_id)  # its lease ran out before the session ended
    fake.clear_requests()
    env.cleanup()
    steps = [r.path if r.path.endswith("/connect") else "tar" for r in fake.requests
             if r.path.endswith("/connect") or "tar cf" in json.dumps(r.body)]
    assert steps[:2] == [f"/v2/sandboxes/{sandbox_id}/connect", "tar"], steps  # resumed, then pulled
    assert (hermes_home / "skills" / "s" / "SKILL.md").read_text() == "from-the-agent\n"
    assert not lifecycle_calls(fake, sandbox_id)  # never paused or killed by us: E2B pauses it again
