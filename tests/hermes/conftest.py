"""A real Hermes Agent driving the real local backend, without an LLM.

Each test gets its own HERMES_HOME (config.yaml written directly, as ``hermes plugins enable`` would
need the network) and its own ``name_prefix``, so its sandboxes are found and destroyed at teardown.
The plugin is discovered through the pip entry point and commands go through Hermes's own
``handle_function_call("terminal", ...)``. The store is the session's ``local_backend`` store, which
the plugin finds through HERMES_SANDBOXES_HOME like it would in production.
"""

from __future__ import annotations

import json
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hermes_sandboxes.backends.local import LocalBackend
from tests.fakes.model_server import ModelServer
from tests.hermes.loop_kit import AgentLoop


class HermesHarness:
    def __init__(self, home: Path, backend: LocalBackend, prefix: str, monkeypatch: pytest.MonkeyPatch):
        self.home = home
        self.backend = backend
        self.prefix = prefix
        self.monkeypatch = monkeypatch
        self.settings: dict[str, Any] = {"name_prefix": prefix}
        self.terminal: dict[str, Any] = {"backend": "sandbox"}
        self.task_ids: set[str] = set()

    def write_config(self, text: str | None = None) -> None:
        if text is None:
            config = {
                "terminal": self.terminal,
                "plugins": {"enabled": ["sandbox"], "entries": {"sandbox": {"settings": self.settings}}},
            }
            text = yaml.safe_dump(config)
        (self.home / "config.yaml").write_text(text)

    def configure(self, **settings: Any) -> None:
        self.settings.update(settings)
        self.write_config()

    def persistent(self, value: bool) -> None:
        self.terminal["container_persistent"] = value
        self.monkeypatch.setenv("TERMINAL_CONTAINER_PERSISTENT", "true" if value else "false")
        self.write_config()

    def call(self, tool: str, args: dict[str, Any], task_id: str = "t1") -> dict[str, Any]:
        from model_tools import handle_function_call

        self.task_ids.add(task_id)
        result = json.loads(handle_function_call(tool, args, task_id=task_id))
        assert isinstance(result, dict)
        return result

    def run(self, command: str, task_id: str = "t1", **args: Any) -> dict[str, Any]:
        return self.call("terminal", {"command": command, **args}, task_id=task_id)

    def env(self, task_id: str = "t1") -> Any:
        from tools.terminal_tool_lifecycle import get_active_env

        return get_active_env(task_id)

    def sandbox_names(self) -> list[str]:
        return [n for n in self.backend.names() if n.startswith(self.prefix + "-")]

    def cleanup_environments(self) -> None:
        from tools.terminal_tool import cleanup_all_environments

        cleanup_all_environments()

    def forget_cwds(self) -> None:
        """Hermes remembers each session's cwd process-wide; a later test must not inherit it."""
        from tools.terminal_tool import clear_session_cwd

        for key in {*self.task_ids, "default", "session:a", "session:b"}:
            clear_session_cwd(key)


def _reset_hermes() -> None:
    from hermes_cli.plugins import _reset_plugin_managers_for_tests, discover_plugins

    _reset_plugin_managers_for_tests()
    discover_plugins(force=True)


@pytest.fixture(scope="session")
def hermes_homes() -> Iterator[Path]:
    """One parent for every HERMES_HOME of the run, removed at its end: Hermes writes into a home
    (e.g. sandboxes/singularity) from its own threads even after a test removed it."""
    parent = Path(tempfile.mkdtemp(prefix="hh-", dir="/tmp"))
    yield parent
    shutil.rmtree(parent, ignore_errors=True)


@pytest.fixture
def hermes(local_backend: LocalBackend, hermes_homes: Path,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[HermesHarness]:
    _ = local_backend.store  # mount now, so the session fixture knows to unmount it at the end
    home = Path(tempfile.mkdtemp(prefix="home-", dir=hermes_homes))
    prefix = "t" + secrets.token_hex(3)
    harness = HermesHarness(home, local_backend, prefix, monkeypatch)
    harness.write_config()
    monkeypatch.setenv("HERMES_HOME", str(home))
    monkeypatch.setenv("HERMES_SANDBOXES_HOME", str(local_backend.home))
    monkeypatch.setenv("TERMINAL_ENV", "sandbox")
    monkeypatch.setenv("TERMINAL_CONTAINER_PERSISTENT", "true")
    monkeypatch.delenv("HERMES_SESSION_KEY", raising=False)
    _reset_hermes()
    try:
        yield harness
    finally:
        harness.cleanup_environments()
        harness.forget_cwds()
        for name in harness.sandbox_names():
            local_backend.get(name).destroy()
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def model_server() -> Iterator[ModelServer]:
    with ModelServer() as server:
        yield server


@pytest.fixture
def agent_loop(local_backend: LocalBackend, hermes_homes: Path, model_server: ModelServer) -> Iterator[AgentLoop]:
    """A Hermes profile for ``hermes chat -q`` runs against the scripted model; its sandboxes are
    destroyed at the end."""
    _ = local_backend.store  # mount now, so the session fixture knows to unmount it at the end
    home = Path(tempfile.mkdtemp(prefix="loop-", dir=hermes_homes))
    loop = AgentLoop(home, local_backend, "l" + secrets.token_hex(3), model_server)
    try:
        yield loop
    finally:
        for name in loop.sandbox_names():
            local_backend.get(name).destroy()
        shutil.rmtree(home, ignore_errors=True)
