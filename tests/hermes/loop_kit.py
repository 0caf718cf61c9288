"""Run the real ``hermes chat -q`` against the scripted model, with the sandbox backend.

Each run is a Hermes subprocess with its own HERMES_HOME (config.yaml written directly: the model is
a ``custom`` provider whose ``base_url`` is the fake on 127.0.0.1, ``terminal.backend: sandbox``,
``plugins.enabled: [sandbox]``) and the test session's throw-away store through
HERMES_SANDBOXES_HOME. Any other egress is pointed at a dead loopback proxy, so a run that tried to
reach the internet would fail instead of leaving the machine.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hermes_sandboxes.backends.local import LocalBackend
from tests.fakes.model_server import MODEL, Conversation, ModelServer, Step, StepFn

HERMES_BIN = Path(sys.executable).parent / "hermes"
DEAD_PROXY = "http://127.0.0.1:9"  # the discard port: nothing listens there
CHECKPOINT_NOTE = re.compile(r"checkpoint (\S+) was taken before this command")


@dataclass
class Run:
    """One ``hermes chat -q`` run: its exit, its output and what the model was told."""

    returncode: int
    output: str
    conversations: list[Conversation]

    @property
    def last(self) -> Conversation:
        assert self.conversations, f"the model was never asked anything; Hermes said:\n{self.output}"
        return self.conversations[-1]

    def tool_results(self) -> list[str]:
        """Every tool result the model saw, in order (the final request carries them all)."""
        return self.last.tool_results()

    def tool_json(self) -> list[dict[str, Any]]:
        """The tool results that are JSON objects, parsed, in order (a deferred tool called through
        ``tool_call`` answers with its own result)."""
        parsed: list[dict[str, Any]] = []
        for text in self.tool_results():
            try:
                value = json.loads(text)
            except ValueError:
                continue
            if isinstance(value, dict):
                parsed.append(value)
        return parsed


def checkpoint_named(text: str) -> str:
    """The automatic checkpoint a terminal result names (the promise under test)."""
    found = CHECKPOINT_NOTE.search(text)
    assert found, f"no automatic checkpoint named in: {text!r}"
    return found.group(1)


class AgentLoop:
    """A Hermes profile whose model is the scripted fake and whose terminal is the sandbox backend."""

    def __init__(self, home: Path, backend: LocalBackend, prefix: str, server: ModelServer) -> None:
        self.home = home
        self.backend = backend
        self.prefix = prefix
        self.server = server
        self.settings: dict[str, Any] = {"name_prefix": prefix}
        self.terminal: dict[str, Any] = {"backend": "sandbox", "container_persistent": True}
        self.approvals: dict[str, Any] = {"mode": "manual", "single_query_mode": "approve"}
        self.settings_yaml: str | None = None  # raw text for the plugin's settings block, when set
        self.enabled: list[str] = ["sandbox"]  # plugins.enabled
        self.plugin = "sandbox"  # whose settings ``settings`` are (a cloud plugin: sprites, e2b)
        self.dotenv: dict[str, str] = {}  # the profile's .env (a cloud plugin's token)

    def config(self) -> dict[str, Any]:
        settings: Any = self.settings if self.settings_yaml is None else "__RAW__"
        return {
            "model": {"provider": "custom", "base_url": self.server.base_url, "default": MODEL,
                      "api_key": "not-a-secret"},
            "terminal": self.terminal,
            "approvals": self.approvals,
            "plugins": {"enabled": self.enabled, "entries": {self.plugin: {"settings": settings}}},
        }

    def write_config(self) -> None:
        text = yaml.safe_dump(self.config())
        if self.settings_yaml is not None:
            indented = "\n".join("        " + line for line in self.settings_yaml.splitlines())
            text = text.replace("settings: __RAW__", "settings:\n" + indented)
        (self.home / "config.yaml").write_text(text)
        if self.dotenv:
            (self.home / ".env").write_text("".join(f"{k}={v}\n" for k, v in self.dotenv.items()))

    def environ(self) -> dict[str, str]:
        # Hermes's own variables and any model credentials stay out; ours (e.g. where host state
        # lives) pass through, so a test session's isolation reaches Hermes too
        env = {k: v for k, v in os.environ.items()
               if k.startswith("HERMES_SANDBOXES_")
               or (not k.startswith(("HERMES_", "TERMINAL_", "OPENAI_", "OPENROUTER_", "ANTHROPIC_"))
                   and k.lower() not in {"http_proxy", "https_proxy", "all_proxy", "no_proxy"})}
        env.update(HERMES_HOME=str(self.home), HERMES_SANDBOXES_HOME=str(self.backend.home),
                   HTTP_PROXY=DEAD_PROXY, HTTPS_PROXY=DEAD_PROXY, ALL_PROXY=DEAD_PROXY,
                   NO_PROXY="127.0.0.1,localhost", NO_COLOR="1", TERM="dumb", COLUMNS="200")
        return env

    def ask(self, steps: Sequence[Step | StepFn], query: str = "Do the task.", *,
            timeout: float = 240) -> Run:
        """Play ``steps`` as the model while Hermes works on ``query``; returns when Hermes exits."""
        self.write_config()
        self.server.play(steps)
        done = subprocess.run([str(HERMES_BIN), "chat", "-q", query], env=self.environ(), cwd=self.home,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
                              check=False)
        run = Run(done.returncode, done.stdout + done.stderr, self.server.model.agent_requests())
        unplayed = len(self.server.model.script) - self.server.model.position
        assert unplayed == 0, f"{unplayed} scripted step(s) never reached; Hermes said:\n{run.output}"
        return run

    def sandbox_names(self) -> list[str]:
        return [n for n in self.backend.names() if n.startswith(self.prefix + "-")]

    def sandbox(self) -> Any:
        """The sandbox of the CLI's task (Hermes's system-prompt probe may have made another)."""
        names = [n for n in self.sandbox_names() if n.startswith(f"{self.prefix}-default-")]
        assert len(names) == 1, f"expected one sandbox for the CLI's task, found {self.sandbox_names()}"
        return self.backend.get(names[0])
