"""Settings of the Sprites backend: what is accepted, what is refused and why, without the SDK."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hermes_sandboxes.backends.sprites.settings import SpritesSettings, find_token
from hermes_sandboxes.settings import InvalidSettings, validate_settings

WHERE = "plugins.entries.sprites.settings"


def build(**raw: object) -> SpritesSettings:
    return validate_settings(SpritesSettings, raw, where=WHERE)


@pytest.mark.parametrize("image", ["ubuntu:24.04", "ghcr.io/acme/box:1.2.3", "ubuntu:latest", 24.04])
def test_an_image_is_refused_with_one_line_saying_why(image: object) -> None:
    """No published create body has an image (Sprites run the service's one base image): the
    setting is refused instead of sent and ignored."""
    with pytest.raises(InvalidSettings) as caught:
        build(image=image)
    assert caught.value.key == f"{WHERE}.image"
    assert "one base image" in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(("key", "bad"), [("max_cpus", 0), ("max_cpus", 129), ("max_cpus", True), ("max_cpus", "2"),
                                          ("max_ram_gb", 1025), ("max_disk_gb", 0), ("max_disk_gb", 2.5)])
def test_sizes_out_of_range_or_not_whole_numbers_are_refused(key: str, bad: object) -> None:
    with pytest.raises(InvalidSettings, match=key):
        build(**{key: bad})


def test_sizes_become_the_spec_and_null_clears_a_setting() -> None:
    settings = build(max_cpus=2, max_ram_gb=4, max_disk_gb=20, image=None)
    spec = settings.spec()
    assert (spec.network, spec.limits.cpus, spec.limits.memory_bytes, spec.limits.disk_bytes, spec.image) == (
        "host", 2.0, 4 << 30, 20 << 30, None)


def test_api_url_comes_from_the_setting_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPRITES_API_URL", raising=False)
    assert build().resolved_api_url() == "https://api.sprites.dev"
    monkeypatch.setenv("SPRITES_API_URL", "http://127.0.0.1:9/")
    assert build().resolved_api_url() == "http://127.0.0.1:9"
    assert build(api_url="https://example.test/").resolved_api_url() == "https://example.test"
    with pytest.raises(InvalidSettings):
        build(api_url="ftp://x")


def test_token_is_read_from_sprites_token_then_sprite_token() -> None:
    env = {"SPRITE_TOKEN": "second"}
    assert find_token(lambda key: env.get(key)) == "second"
    env["SPRITES_TOKEN"] = "first"
    assert find_token(lambda key: env.get(key)) == "first"
    assert find_token(lambda key: None) is None
    with pytest.raises(InvalidSettings, match="unknown setting"):
        build(token="x")  # never a setting: it would end up in config files


def test_the_settings_module_does_not_import_the_sdk() -> None:
    code = ("import sys, hermes_sandboxes.backends.sprites.settings as s; s.SpritesSettings(max_cpus=2); "
            "print('sprites' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
