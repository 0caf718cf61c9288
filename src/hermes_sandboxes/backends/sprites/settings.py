"""Settings of the Sprites backend (Fly.io): what new Sprites are made of, and where the API is.

Light on purpose: no SDK import, so the registry, the CLI and the Hermes plugin can validate these
settings (and say what is wrong) on a machine without the ``sprites`` extra. The token is never a
setting: it comes from the environment (``SPRITES_TOKEN``, then ``SPRITE_TOKEN``), so it cannot end
up in a config file, a settings dump or an error message about a setting.

``max_cpus``, ``max_ram_gb`` and ``max_disk_gb`` apply only when a Sprite is created; an existing
Sprite is resumed as it is. ``image`` is refused: no published source (the API reference, sprites-go,
sprites-py) has an image in the create body, and Sprites run one base image that the service
upgrades; sending one would be ignored, so the setting says so instead.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Literal

from pydantic import field_validator

from hermes_sandboxes.sandbox import Limits, SandboxSpec
from hermes_sandboxes.settings import BackendSettings, allow_list, require_text, whole_number

DEFAULT_API_URL = "https://api.sprites.dev"
API_URL_ENV = "SPRITES_API_URL"
TOKEN_ENVS = ("SPRITES_TOKEN", "SPRITE_TOKEN")  # in this order
CREATE_WAIT_S = 240.0  # inside Hermes's 420 s terminal deadline
GIB = 1 << 30


IDLE_REFUSAL = ("Sprites sleep by themselves when idle (warm after about 30 s without activity, later cold; "
                "files kept, the next command wakes the Sprite): no other idle timeout can be set, remove it")


class SpritesSettings(BackendSettings):
    """``image``: refused (see above). ``max_cpus`` 1-128, ``max_ram_gb`` and ``max_disk_gb`` 1-1024: the size of
    new Sprites, unset the service's default. ``api_url``: else $SPRITES_API_URL, else the public
    API. ``create_wait_s``: how long a create may take before "still being created; retry"."""

    backend: Literal["sprites"] = "sprites"
    image: str | None = None
    max_cpus: int | None = None
    max_ram_gb: int | None = None
    max_disk_gb: int | None = None
    api_url: str | None = None
    create_wait_s: float = CREATE_WAIT_S
    # an egress allow-list (network "proxy"): None for none; the Sprite's network policy (network.py)
    allow: tuple[str, ...] | None = None
    brokered: None = None  # refused: see _brokered

    @field_validator("idle_timeout", mode="before")
    @classmethod
    def _no_idle_timeout(cls, value: object) -> float:
        raise ValueError(IDLE_REFUSAL)

    @field_validator("image", mode="before")
    @classmethod
    def _image(cls, value: object) -> None:
        if value is None:
            return None
        raise ValueError(f"{value!r}: Sprites have one base image (the service's, upgraded by it) and the "
                         "create API takes no image; remove the setting, install what you need in the "
                         "Sprite and checkpoint it")

    @field_validator("brokered", mode="before")
    @classmethod
    def _brokered(cls, value: object) -> None:
        if value is None or value == {}:
            return None
        raise ValueError("credential brokering needs this host's egress proxy in the path, and a Sprite's "
                         "traffic never passes it; pass the secret to the one command that needs it instead "
                         "(the credentials setting)")

    @field_validator("allow", mode="before")
    @classmethod
    def _allow(cls, value: object) -> tuple[str, ...]:
        return allow_list(value)

    @field_validator("max_cpus", mode="before")
    @classmethod
    def _cpus(cls, value: object) -> int:
        return whole_number(value, 1, "CPUs", maximum=128)

    @field_validator("max_ram_gb", "max_disk_gb", mode="before")
    @classmethod
    def _gigabytes(cls, value: object) -> int:
        return whole_number(value, 1, "GB", maximum=1024)

    @field_validator("api_url", mode="before")
    @classmethod
    def _api_url(cls, value: object) -> str:
        text = require_text(value, "an http(s) URL such as https://api.sprites.dev")
        if not re.match(r"^https?://[^\s/]+(/\S*)?$", text):
            raise ValueError(f"{text!r} is not an http(s) URL")
        return text.rstrip("/")

    @field_validator("create_wait_s", mode="before")
    @classmethod
    def _create_wait(cls, value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 400:
            raise ValueError(f"got {value!r}; expected a number of seconds between 0 and 400")
        return float(value)

    def resolved_api_url(self) -> str:
        return (self.api_url or os.environ.get(API_URL_ENV) or DEFAULT_API_URL).rstrip("/")

    def spec(self) -> SandboxSpec:
        """Sprites reach the internet ("host" network); their size comes from here."""
        limits = Limits(
            memory_bytes=self.max_ram_gb * GIB if self.max_ram_gb else None,
            cpus=float(self.max_cpus) if self.max_cpus else None,
            disk_bytes=self.max_disk_gb * GIB if self.max_disk_gb else None,
        )
        if self.allow is not None:
            return SandboxSpec(network="proxy", allow=self.allow, limits=limits)
        return SandboxSpec(network="host", limits=limits)


def find_token(lookup: Callable[[str], str | None] = os.environ.get) -> str | None:
    """The Sprites token: ``SPRITES_TOKEN``, then ``SPRITE_TOKEN`` (``lookup`` may be a profile's
    secret store instead of this process's environment)."""
    for name in TOKEN_ENVS:
        value = lookup(name)
        if value:
            return value
    return None

