"""``/sandbox undo`` in a real ``hermes chat -q`` whose terminal is a Sprite of the loopback fake: the
preview lists the commands and the files the undo throws away, compared inside the Sprite against
its checkpoint mount."""

from __future__ import annotations

import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermes_sandboxes.backends.local import LocalBackend
from tests.fakes.model_server import ModelServer
from tests.fakes.sprites import FakeSprites
from tests.hermes.conftest import model_server  # noqa: F401 - a fixture
from tests.hermes.loop_kit import AgentLoop
from tests.hermes.test_slash import as_human, undo_story


@pytest.fixture
def sprites_loop(fake: FakeSprites, local_backend: LocalBackend, model_server: ModelServer,  # noqa: F811
                 monkeypatch: pytest.MonkeyPatch) -> Iterator[AgentLoop]:
    home = Path(tempfile.mkdtemp(prefix="spl-", dir="/tmp"))
    loop = AgentLoop(home, local_backend, "s" + secrets.token_hex(3), model_server)
    loop.plugin, loop.enabled = "sprites", ["sprites"]
    loop.terminal["backend"] = "sprites"
    loop.settings.update(api_url=fake.url)
    loop.dotenv = {"SPRITES_TOKEN": fake.token}
    for name in ("SPRITES_TOKEN", "SPRITE_TOKEN", "SPRITES_API_URL"):
        monkeypatch.delenv(name, raising=False)
    try:
        yield loop
    finally:
        from tools.terminal_tool import cleanup_all_environments

        cleanup_all_environments()
        shutil.rmtree(home, ignore_errors=True)


def test_undo_from_the_chat_on_a_sprite(sprites_loop: AgentLoop, fake: FakeSprites,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    chat = as_human(sprites_loop, monkeypatch)
    undo_story(sprites_loop, chat, diffs=True)
    assert any(r.path.endswith("/restore") for r in fake.recorded("POST")), "the Sprite itself was restored"
