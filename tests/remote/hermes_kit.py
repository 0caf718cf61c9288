"""A real Hermes on a remote backend over its fake, for the state-sync tests: a profile home per test
(config, key or token in its .env), commands through Hermes's own terminal tool in this process, and
a second Hermes process that can be stopped cleanly or killed like a crash."""

from __future__ import annotations

import json
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.remote.conftest import Remote

TASK = "t-state"
_CHILD = textwrap.dedent(f"""
    import json, sys
    from hermes_cli.plugins import discover_plugins
    discover_plugins(force=True)
    from model_tools import handle_function_call
    from tools.terminal_tool import cleanup_all_environments
    print("up", flush=True)
    for line in sys.stdin:
        tool, args = json.loads(line)
        print(json.dumps(json.loads(handle_function_call(tool, args, task_id={TASK!r}))), flush=True)
    cleanup_all_environments()
""")


class OtherHermes:
    """Another Hermes process on the same profile; ``run`` calls its terminal tool."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "up", self.proc.stderr

    def call(self, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps([tool, args]) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, self.proc.stderr.read() if self.proc.stderr else "no output"
        result: dict[str, Any] = json.loads(line)
        return result

    def run(self, command: str) -> dict[str, Any]:
        return self.call("terminal", {"command": command})

    def exit(self) -> None:
        self.proc.communicate(timeout=120)
        assert self.proc.returncode == 0

    def crash(self) -> None:
        """SIGKILL: no teardown, no pull-back (the writer lease goes with the process)."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.communicate(timeout=60)

    def stop(self) -> None:
        """End it as a session ends (its cleanup releases its lease and removes the lease files);
        kill it if it does not end."""
        if self.proc.poll() is not None:
            return
        try:
            self.proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate(timeout=60)


def call_here(tool: str, args: dict[str, Any]) -> dict[str, Any]:
    from model_tools import handle_function_call

    result: dict[str, Any] = json.loads(handle_function_call(tool, args, task_id=TASK))
    return result


def run_here(command: str) -> dict[str, Any]:
    return call_here("terminal", {"command": command})


def refused_here(command: str) -> str:
    """Run ``command`` through this process's environment of the task, expecting a refusal (Hermes's
    terminal tool would retry a refused command three times, 14 s of pauses, before reporting it)."""
    from tools.environments.base import EnvironmentConnectionError
    from tools.terminal_tool_lifecycle import get_active_env

    env = get_active_env(TASK) or get_active_env("default")
    assert env is not None, "no environment of the task in this process"
    with pytest.raises(EnvironmentConnectionError) as refused:
        env.execute(command)
    return str(refused.value)


def cleanup_here() -> None:
    from tools.terminal_tool import cleanup_all_environments

    cleanup_all_environments()


def hermes_home(remote: Remote, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A profile whose terminal backend is ``remote`` (persistent, sync at every command)."""
    home = Path(tempfile.mkdtemp(prefix="hsrm-", dir="/tmp"))
    prefix = f"hs{secrets.token_hex(3)}"
    settings: dict[str, Any] = {"name_prefix": prefix}
    if remote.kind == "e2b":
        from tests.fakes.e2b import API_KEY

        (home / ".env").write_text(f"E2B_API_KEY={API_KEY}\n")
        monkeypatch.setenv("E2B_API_URL", remote.fake.url)
        monkeypatch.setenv("E2B_SANDBOX_URL", remote.fake.url)
        monkeypatch.delenv("E2B_API_KEY", raising=False)
        remote.fake.world.faults.clear()
    else:
        settings["api_url"] = remote.fake.url
        (home / ".env").write_text(f"SPRITES_TOKEN={remote.fake.token}\n")
        for name in ("SPRITES_TOKEN", "SPRITE_TOKEN", "SPRITES_API_URL"):
            monkeypatch.delenv(name, raising=False)
        remote.fake.reset()
    config = {"terminal": {"backend": remote.kind},
              "plugins": {"enabled": [remote.kind], "entries": {remote.kind: {"settings": settings}}}}
    (home / "config.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.setenv("HERMES_HOME", str(home))
    monkeypatch.setenv("TERMINAL_ENV", remote.kind)
    monkeypatch.setenv("TERMINAL_CONTAINER_PERSISTENT", "true")
    monkeypatch.setenv("HERMES_FORCE_FILE_SYNC", "1")  # Hermes's own knob: sync at every command
    from hermes_cli.plugins import _reset_plugin_managers_for_tests, discover_plugins

    _reset_plugin_managers_for_tests()
    discover_plugins(force=True)
    try:
        yield home
    finally:
        cleanup_here()
        if remote.kind == "e2b":
            remote.fake.world.faults.clear()
            for sandbox in remote.fake.sandboxes():
                remote.fake.world.kill(sandbox)
        else:
            remote.fake.reset()
            remote.fake.quiesce()
            errors = remote.fake.world.destroy_all()
            assert not errors, errors
        shutil.rmtree(home, ignore_errors=True)


def writes(remote: Remote) -> list[str]:
    """The files below ~/.hermes the service was asked to write since its request log was cleared."""
    if remote.kind == "e2b":
        paths = [str(r.query.get("path", [""])[0]) for r in remote.fake.calls("POST", "/files")]
    else:
        paths = [dict(r.query)["path"] for r in remote.fake.recorded("PUT") if r.path.endswith("/fs/write")]
    return sorted(p for p in paths if "/.hermes/" in p)


def clear_requests(remote: Remote) -> None:
    if remote.kind == "e2b":
        remote.fake.clear_requests()
    else:
        remote.fake.reset()  # its request log (and faults: none are armed when a test counts)


def fail_writes(remote: Remote) -> None:
    """Every file write into a sandbox fails with a 500 until ``clear_faults``."""
    if remote.kind == "e2b":
        remote.fake.fail("POST", "/files", 500, times=1000)
    else:
        from tests.fakes.sprites.server import Fault

        remote.fake.inject(Fault("PUT", r"/v1/sprites/[^/]+/fs/write", status=500, times=1000))


def cut_exec_streams(remote: Remote) -> None:
    """Every command's output stream is cut after its first output until ``clear_faults``."""
    if remote.kind == "e2b":
        remote.fake.drop_stream("Start", after_events=2, times=1000)
    else:
        from tests.fakes.sprites.server import Fault

        remote.fake.inject(Fault("WS", r"/v1/sprites/[^/]+/exec", drop_exec=True, times=1000))


def clear_faults(remote: Remote) -> None:
    if remote.kind == "e2b":
        remote.fake.world.faults.clear()
    else:
        remote.fake.reset()


def cli(remote: Remote, *args: str) -> str:
    """The ``hermes-sandboxes`` command, in its own process, on the same account and profile as the
    Hermes of this process (its credentials from the environment, as a user's shell has them)."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPRITES_", "SPRITE_", "E2B_API_KEY"))}
    env["HERMES_SANDBOXES_BACKEND"] = remote.kind
    if remote.kind == "e2b":
        from tests.fakes.e2b import API_KEY

        env["E2B_API_KEY"] = API_KEY
    else:
        env.update(SPRITES_TOKEN=remote.fake.token, SPRITES_API_URL=remote.fake.url, SPRITES_CLIENT_SIGNALS="0")
    done = subprocess.run([sys.executable, "-m", "hermes_sandboxes.cli", *args], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout
