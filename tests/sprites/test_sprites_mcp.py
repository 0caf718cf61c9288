"""The MCP server over the Sprites backend (the real sprites-py SDK against the fake): the shared story,
with what Sprites cannot do (fork) said in the tool results instead."""

from __future__ import annotations

import os
from pathlib import Path

from hermes_sandboxes.backends.sprites import SpritesBackend
from hermes_sandboxes.backends.sprites.settings import SpritesSettings
from tests.fakes.sprites import FakeSprites
from tests.mcp.conformance import run_story


def test_the_mcp_tools_tell_the_story_on_sprites_and_say_what_it_cannot(fake: FakeSprites, tmp_path: Path) -> None:
    with SpritesBackend(SpritesSettings(api_url=fake.url), token=fake.token) as backend:
        told = run_story(backend, tmp_path / "state", f"spm{os.getpid()}", api_url=fake.url)
    assert told["preview_diff_unavailable"] is None and "diff" not in told  # Sprites diff checkpoints
    assert "cannot fork" in told["fork"]
