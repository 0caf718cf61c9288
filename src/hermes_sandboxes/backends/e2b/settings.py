"""Settings of the E2B backend (plugin id ``e2b``): the keys the existing E2B plugin reads, validated.

This module must stay light: it never imports the E2B SDK, so a registry can list and validate the
backend's settings on a machine where the ``e2b`` extra is not installed. The existing plugin falls
back to defaults on a bad value; here a bad value is an error naming its key (see settings.py for the
YAML rules every backend shares).
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator

from hermes_sandboxes.sandbox import SandboxSpec
from hermes_sandboxes.settings import (
    BackendSettings,
    absolute_path,
    allow_list,
    flag,
    require_text,
    text_mapping,
    whole_number,
)

DEFAULT_TEMPLATE = "base"
DEFAULT_HOME = "/home/user"  # the default user's home in E2B's templates
DEFAULT_LEASE_SECONDS = 300
DEFAULT_COMMAND_GRACE_SECONDS = 30
MAX_LEASE_SECONDS = 86_400  # E2B's longest lease (Pro); the API refuses more
MAX_METADATA_ENTRIES = 32


class E2BSettings(BackendSettings):
    """``plugins.entries.e2b.settings``."""

    backend_id: ClassVar[str] = "e2b"

    backend: Literal["e2b"] = "e2b"
    template: str = DEFAULT_TEMPLATE
    cwd: str = DEFAULT_HOME
    lease_seconds: int = Field(default=DEFAULT_LEASE_SECONDS, description="baseline lease; extended per command")
    command_grace_seconds: int = Field(default=DEFAULT_COMMAND_GRACE_SECONDS,
                                       description="lease headroom beyond a command's timeout")
    allow_internet_access: bool = True
    # an egress allow-list (network "proxy"): None for none; mapped onto E2B's rules (e2b/network.py)
    allow: tuple[str, ...] | None = None
    secure: bool = True
    metadata: dict[str, str] = Field(default_factory=dict)
    brokered: None = None  # refused: see _brokered

    def spec(self) -> SandboxSpec:
        """The posture the settings ask for: the backend reads a spec's network as internet access,
        so the default spec (no network) would silently deny it."""
        if self.allow is not None:
            return SandboxSpec(network="proxy", allow=self.allow, idle_timeout=self.idle_timeout)
        return SandboxSpec(network="host" if self.allow_internet_access else "none", idle_timeout=self.idle_timeout)

    @property
    def lease(self) -> int:
        """The baseline lease: ``idle_timeout`` where set (on E2B an idle timeout is the lease: the
        service pauses a sandbox whose lease ran out, files kept, and the next command resumes it),
        else ``lease_seconds``."""
        return math.ceil(self.idle_timeout) if self.idle_timeout is not None else self.lease_seconds

    @field_validator("idle_timeout", mode="after")
    @classmethod
    def _idle_lease(cls, value: float | None) -> float | None:
        if value is not None and value > MAX_LEASE_SECONDS:
            raise ValueError(f"{value:g} s is longer than E2B's longest lease ({MAX_LEASE_SECONDS} s)")
        return value

    @field_validator("allow", mode="before")
    @classmethod
    def _allow(cls, value: object, info: ValidationInfo) -> tuple[str, ...]:
        if info.data.get("allow_internet_access") is False:
            raise ValueError("allow_internet_access: false denies all egress; remove it to use an allow-list")
        return allow_list(value)

    @field_validator("brokered", mode="before")
    @classmethod
    def _brokered(cls, value: object) -> None:
        if value is None or value == {}:
            return None
        raise ValueError("credential brokering needs this host's egress proxy in the path, and an E2B sandbox's "
                         "traffic never passes it; pass the secret to the one command that needs it instead "
                         "(the credentials setting)")

    @field_validator("backend", mode="before")
    @classmethod
    def _backend(cls, value: object) -> str:
        if value != "e2b":
            raise ValueError(f"got {value!r}; these are the settings of the 'e2b' backend")
        return "e2b"

    @field_validator("template", mode="before")
    @classmethod
    def _template(cls, value: object) -> str:
        text = require_text(value, "an E2B template name or id, e.g. base")
        if not text.strip() or any(c.isspace() for c in text):
            raise ValueError(f"{text!r} is not a template name or id (no spaces, not empty)")
        return text

    @field_validator("cwd", mode="before")
    @classmethod
    def _cwd(cls, value: object) -> str:
        return absolute_path(value, "an absolute directory path in the sandbox, e.g. /home/user")

    @field_validator("lease_seconds", mode="before")
    @classmethod
    def _lease(cls, value: object) -> int:
        return whole_number(value, 1, "seconds", maximum=MAX_LEASE_SECONDS)  # E2B's longest

    @field_validator("command_grace_seconds", mode="before")
    @classmethod
    def _grace(cls, value: object) -> int:
        return whole_number(value, 0, "seconds")

    @field_validator("allow_internet_access", "secure", mode="before")
    @classmethod
    def flag(cls, value: object) -> bool:
        return flag(value)

    @field_validator("metadata", mode="before")
    @classmethod
    def _metadata(cls, value: object) -> dict[str, str]:
        return text_mapping(value, max_entries=MAX_METADATA_ENTRIES, example="{team: infra}")
