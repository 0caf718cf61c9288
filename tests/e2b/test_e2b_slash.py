"""``/sandbox undo`` in a real ``hermes chat -q`` whose terminal is a sandbox of the loopback fake E2B
(a restore there makes a new sandbox from the snapshot under the same identity; no diffs)."""

from __future__ import annotations

import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermes_sandboxes.backends.local import LocalBackend
from tests.fakes.e2b import API_KEY, FakeE2B
from tests.fakes.model_server import ModelServer
from tests.hermes.conftest import model_server  # noqa: F401 - a fixture
from tests.hermes.loop_kit import AgentLoop
from tests.hermes.test_slash import as_human, undo_story


@pytest.fixture
def e2b_loop(fake: FakeE2B, local_backend: LocalBackend, model_server: ModelServer,  # noqa: F811
             monkeypatch: pytest.MonkeyPatch) -> Iterator[AgentLoop]:
    home = Path(tempfile.mkdtemp(prefix="e2l-", dir="/tmp"))
    loop = AgentLoop(home, local_backend, "e" + secrets.token_hex(3), model_server)
    loop.plugin, loop.enabled = "e2b", ["e2b"]
    loop.terminal["backend"] = "e2b"
    loop.dotenv = {"E2B_API_KEY": API_KEY}
    monkeypatch.setenv("E2B_API_URL", fake.url)  # the Hermes runs inherit them (loop_kit passes E2B_*)
    monkeypatch.setenv("E2B_SANDBOX_URL", fake.url)
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    before = {sb.sandbox_id for sb in fake.sandboxes()}
    try:
        yield loop
    finally:
        from tools.terminal_tool import cleanup_all_environments

        cleanup_all_environments()
        for sb in fake.sandboxes():
            if sb.sandbox_id not in before:
                fake.world.kill(sb)
        shutil.rmtree(home, ignore_errors=True)


def test_undo_from_the_chat_on_e2b(e2b_loop: AgentLoop, monkeypatch: pytest.MonkeyPatch) -> None:
    chat = as_human(e2b_loop, monkeypatch)
    undo_story(e2b_loop, chat, diffs=False)
