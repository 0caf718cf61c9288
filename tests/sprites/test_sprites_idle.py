"""Sprites sleep by themselves when idle: an ``idle_timeout`` is refused with one line that says so,
from the settings and from a spec."""

from __future__ import annotations

import pytest

from hermes_sandboxes.backends.sprites import SpritesBackend
from hermes_sandboxes.backends.sprites.settings import SpritesSettings
from hermes_sandboxes.errors import Unsupported
from hermes_sandboxes.sandbox import SandboxSpec
from hermes_sandboxes.settings import InvalidSettings, validate_settings
from tests.fakes.sprites import FakeSprites

WHERE = "plugins.entries.sprites.settings"


def test_an_idle_timeout_setting_is_refused_in_one_line() -> None:
    with pytest.raises(InvalidSettings) as caught:
        validate_settings(SpritesSettings, {"idle_timeout": "30m"}, where=WHERE)
    assert caught.value.key == f"{WHERE}.idle_timeout"
    assert "sleep by themselves" in caught.value.reason and "\n" not in str(caught.value)
    assert validate_settings(SpritesSettings, {"idle_timeout": None}, where=WHERE).idle_timeout is None


def test_a_spec_with_an_idle_timeout_is_refused_before_anything_is_made(fake: FakeSprites) -> None:
    backend = SpritesBackend(SpritesSettings(api_url=fake.url), token=fake.token)
    with pytest.raises(Unsupported, match="sleep by themselves"):
        backend.create("idle-sprite", SandboxSpec(network="host", idle_timeout=600))
    assert not [r for r in fake.recorded("POST") if r.path == "/v1/sprites"]
