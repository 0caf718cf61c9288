"""Validated settings, one model per backend: a bad value is an error that names its key, never a default.

Settings usually come from YAML (Hermes's ``plugins.entries.<id>.settings``), and YAML 1.1 turns bare
words into other types: ``off`` and ``no`` become ``False``, ``123`` an int, ``1e3`` a float,
``null``/``~`` None. The rules here, chosen so nothing is silently coerced:

* ``null`` (None) clears a setting: the key behaves as if it were absent and its default applies.
* a boolean or number where text is expected is rejected with a hint to quote it, because the
  user's text has already been lost (``007`` reads back as ``7``).
* the one exception is ``auto_checkpoint: off`` -> ``False``, which means exactly "off", so ``False``
  is read as ``"off"``; ``True`` is rejected because it does not say which policy.
* unknown keys are rejected: a misspelt key would otherwise be ignored without a word.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hermes_sandboxes.errors import InvalidInput
from hermes_sandboxes.names import NAME_RE
from hermes_sandboxes.sandbox import NETWORK_MODES, Limits, NetworkMode, SandboxSpec
from hermes_sandboxes.util.units import parse_duration, parse_size

MAX_PREFIX_LENGTH = 40
DEFAULT_NAME_PREFIX = "hermes"
REDACTED = "[redacted]"

_SECRET_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PROGRAM_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+-]*$")

Scope = Literal["session", "instance"]
AutoCheckpoint = Literal["off", "risky", "always"]


class InvalidSettings(InvalidInput):
    """A setting is invalid. ``key`` is the full config path, ``reason`` says what to write instead."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


class InvalidOption(InvalidSettings):
    """A setting given on the command line (``-o KEY=VALUE`` or the flag that sets it) is invalid:
    bad usage, which a CLI reports with exit 2 rather than as an error of the sandbox or a file."""


def _yaml_hint(value: object, expected: str) -> str:
    """Why a non-text value is refused, in words true of YAML, TOML and ``-o`` alike (each reads a
    bare ``off`` or ``123`` as a boolean or a number; quotes keep it text)."""
    kind = {bool: "a boolean", int: "a number", float: "a number"}.get(type(value), type(value).__name__)
    return f"{value!r} was read as {kind}, not text; expected {expected} (put the value in quotes)"


def require_text(value: object, expected: str) -> str:
    if not isinstance(value, str):
        raise ValueError(_yaml_hint(value, expected))
    return value


def _size(value: object, expected: str, minimum: int, too_small: str) -> int:
    """A size with a unit (a bare number is refused), at least ``minimum`` bytes."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        raise ValueError(f"{value!r} has no unit (bytes? megabytes?); expected {expected}, in quotes")
    text = require_text(value, expected)
    try:
        size = parse_size(text, unit_required=True)
    except InvalidInput as exc:
        raise ValueError(str(exc)) from None
    if size < minimum:
        raise ValueError(f"{text!r} is {too_small}")
    return size


def whole_number(value: object, minimum: int, what: str, maximum: int | None = None) -> int:
    expected = f"a whole number of {what}, at least {minimum}"
    number = _require_number(value, expected)
    if not isinstance(number, int) or number < minimum:
        raise ValueError(f"got {value!r}; expected {expected}")
    if maximum is not None and number > maximum:
        raise ValueError(f"got {value!r}; expected at most {maximum} {what}")
    return number


def absolute_path(value: object, expected: str = "an absolute path") -> str:
    text = require_text(value, expected)
    if not text.startswith("/"):
        raise ValueError(f"{text!r} is not an absolute path")
    return text


def flag(value: object) -> bool:
    """Only YAML's own booleans: a quoted "false" would otherwise be a truthy string."""
    if not isinstance(value, bool):
        raise ValueError(f"got {value!r}; expected true or false (unquoted)")
    return value


def text_mapping(value: object, *, max_entries: int, example: str) -> dict[str, str]:
    """A mapping of non-empty text keys to text values (labels, metadata)."""
    if not isinstance(value, Mapping):
        raise ValueError(f"expected a mapping of text to text, e.g. {example}")
    if len(value) > max_entries:
        raise ValueError(f"{len(value)} entries; at most {max_entries} are allowed")
    result: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"key {key!r} must be non-empty text")
        result[key] = require_text(item, f"text for key {key!r}")
    return result


def allow_list(value: object) -> tuple[str, ...]:
    """An egress allow-list in the portable grammar (allowlist.py), presets included."""
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise ValueError("expected a list of hosts, e.g. [pypi.org, '*.pythonhosted.org', '127.0.0.1:8080']")
    for item in value:
        if not isinstance(item, str) or not item.strip():
            raise ValueError(f"{item!r} is not a host name, IP address or @preset")
    from hermes_sandboxes import allowlist as policy  # the allow-list's own grammar, presets included

    try:
        return policy.validate(value)
    except InvalidInput as exc:
        raise ValueError(str(exc)) from None


def _require_number(value: object, expected: str) -> int | float:
    # bool is an int subclass: `pids: yes` must not become 1.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"got {value!r}; expected {expected}")
    return value


class BackendSettings(BaseModel):
    """Settings every backend shares. Subclasses add their backend's own keys and a ``backend``
    field whose literal value names the backend (the discriminator of the registry)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    # keys whose values are secrets: shown as REDACTED by ``display()`` (`hermes-sandboxes config`)
    secret_keys: ClassVar[frozenset[str]] = frozenset()

    name_prefix: str = DEFAULT_NAME_PREFIX
    scope: Scope = "session"
    auto_checkpoint: AutoCheckpoint = "risky"
    retention: int = Field(default=10, description="automatic checkpoints kept per sandbox")
    retention_bytes: int | None = Field(
        default=None, description="bytes (a size such as 5G) the checkpoints of a sandbox may add up to")
    retention_min_age: float = Field(
        default=600.0, description="seconds (or 90s, 10m, 1h) an automatic checkpoint is kept whatever retention")
    credentials: dict[str, str] = Field(default_factory=dict)
    protected_paths: tuple[str, ...] = ()
    # run inside the sandbox before manual and agent checkpoints (e.g. the test suite); its result is
    # part of the checkpoint's story
    health_command: str | None = None
    idle_timeout: float | None = Field(
        default=None, description="seconds (or 30m, 2h) without a command before a new sandbox is stopped")

    @field_validator("name_prefix", mode="before")
    @classmethod
    def _prefix(cls, value: object) -> str:
        text = require_text(value, "lowercase letters, digits and single hyphens")
        if len(text) > MAX_PREFIX_LENGTH:
            raise ValueError(f"{text!r} is {len(text)} characters; at most {MAX_PREFIX_LENGTH} are allowed")
        if not NAME_RE.match(text):
            raise ValueError(
                f"{text!r} is not allowed: use lowercase letters, digits and single hyphens, "
                "not starting or ending with a hyphen"
            )
        return text

    @field_validator("scope", mode="before")
    @classmethod
    def _scope(cls, value: object) -> str:
        text = require_text(value, "'session' or 'instance'")
        if text not in ("session", "instance"):
            raise ValueError(f"{text!r} is not a scope; use 'session' or 'instance'")
        return text

    @field_validator("auto_checkpoint", mode="before")
    @classmethod
    def _auto_checkpoint(cls, value: object) -> str:
        if value is False:  # `auto_checkpoint: off` unquoted: YAML 1.1 says False, the user said off
            return "off"
        if value is True:
            raise ValueError("true does not say which policy; use 'risky' or 'always'")
        text = require_text(value, "'off', 'risky' or 'always'")
        if text not in ("off", "risky", "always"):
            raise ValueError(f"{text!r} is not a policy; use 'off', 'risky' or 'always'")
        return text

    @field_validator("retention", mode="before")
    @classmethod
    def _retention(cls, value: object) -> int:
        return whole_number(value, 1, "checkpoints")

    @field_validator("retention_bytes", mode="before")
    @classmethod
    def _retention_bytes(cls, value: object) -> int:
        return _size(value, "a size with a unit, e.g. 5G", 1024**2, "too small; use at least 1M")

    @field_validator("retention_min_age", mode="before")
    @classmethod
    def _retention_min_age(cls, value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ValueError(_yaml_hint(value, "a duration such as 600, 90s, 10m or 1h"))
        try:
            return parse_duration(value)
        except InvalidInput as exc:
            raise ValueError(str(exc)) from None

    @field_validator("credentials", mode="before")
    @classmethod
    def _credentials(cls, value: object) -> dict[str, str]:
        if not isinstance(value, Mapping):
            raise ValueError("expected a mapping of program to secret name, e.g. {flyctl: FLY_API_TOKEN}")
        result: dict[str, str] = {}
        for program, secret in value.items():
            if not isinstance(program, str) or not _PROGRAM_RE.match(program):
                raise ValueError(f"{program!r} is not a program name (a bare name such as flyctl, no path)")
            if not isinstance(secret, str) or not _SECRET_NAME_RE.match(secret):
                raise ValueError(f"secret for {program!r} must be an env variable name, got {secret!r}")
            result[program] = secret
        return result

    @field_validator("protected_paths", mode="before")
    @classmethod
    def _protected(cls, value: object) -> tuple[str, ...]:
        return absolute_paths(value)

    @field_validator("idle_timeout", mode="before")
    @classmethod
    def _idle_timeout(cls, value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ValueError(_yaml_hint(value, "a duration such as 1800, 30m or 2h"))
        try:
            seconds = parse_duration(value)
        except InvalidInput as exc:
            raise ValueError(str(exc)) from None
        if seconds <= 0:
            raise ValueError("must be more than 0 seconds; remove the key (or set it to null) for no idle stop")
        return seconds

    @field_validator("health_command", mode="before")
    @classmethod
    def _health(cls, value: object) -> str:
        text = require_text(value, "a shell command line, e.g. 'cd /root/app && pytest -q'")
        if not text.strip():
            raise ValueError("is empty; remove the key (or set it to null) to run no health command")
        return text


    def spec(self) -> SandboxSpec:
        """The spec new sandboxes get from these settings (CLI flags may override parts of it)."""
        return SandboxSpec()

    def display(self) -> dict[str, Any]:
        """Every effective setting, secrets redacted, for showing to a person."""
        data = self.model_dump(mode="json")
        return {k: (REDACTED if k in self.secret_keys and v else v) for k, v in data.items()}


class SpecSettings(BackendSettings):
    """The portable spec as settings (network, allow-list, limits), for backends that honour them."""

    network: NetworkMode = "none"
    allow: tuple[str, ...] = ()
    memory: int | None = Field(default=None, description="bytes; written as a size such as 2G")
    pids: int | None = None
    cpus: float | None = None
    # bytes; the sandbox's own data, including what only its checkpoints keep alive
    disk: int | None = Field(default=None, description="bytes; written as a size such as 10G")

    @field_validator("network", mode="before")
    @classmethod
    def _network(cls, value: object) -> str:
        modes = ", ".join(repr(m) for m in NETWORK_MODES)
        text = require_text(value, modes)
        if text not in NETWORK_MODES:
            raise ValueError(f"{text!r} is not a network mode; use one of {modes}")
        return text

    @field_validator("allow", mode="before")
    @classmethod
    def _allow(cls, value: object) -> tuple[str, ...]:
        return allow_list(value)

    @field_validator("memory", mode="before")
    @classmethod
    def _memory(cls, value: object) -> int:
        # A bare YAML number is refused: 2048 could mean bytes or megabytes.
        return _size(value, "a size with a unit, e.g. 512M or 2G", 16 * 1024**2,
                     "too small for a shell; use at least 16M")

    @field_validator("disk", mode="before")
    @classmethod
    def _disk(cls, value: object) -> int:
        return _size(value, "a size with a unit, e.g. 512M or 10G", 1024**2, "too small; use at least 1M")

    @field_validator("pids", mode="before")
    @classmethod
    def _pids(cls, value: object) -> int:
        return whole_number(value, 8, "processes")

    @field_validator("cpus", mode="before")
    @classmethod
    def _cpus(cls, value: object) -> float:
        number = _require_number(value, "a number of CPUs such as 0.5 or 2")
        if number <= 0 or number > 1024:
            raise ValueError(f"got {value!r}; expected a number of CPUs between 0 and 1024")
        return float(number)

    def spec(self) -> SandboxSpec:
        return SandboxSpec(network=self.network, allow=self.allow,
                           limits=Limits(memory_bytes=self.memory, pids=self.pids, cpus=self.cpus,
                                         disk_bytes=self.disk), idle_timeout=self.idle_timeout)


def absolute_paths(value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise ValueError("expected a list of absolute paths")
    return tuple(absolute_path(item) for item in value)


S = TypeVar("S", bound=BackendSettings)


def validate_settings(model: type[S], raw: object, *, where: str) -> S:
    """Build ``model`` from ``raw`` (a mapping or None), or raise InvalidSettings naming the key.

    ``where`` is the config path of the mapping, e.g. ``plugins.entries.sandbox.settings``.
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise InvalidSettings(where, f"expected a mapping of settings, got {type(raw).__name__}")
    cleared = {key: value for key, value in raw.items() if value is not None}
    try:
        return model.model_validate(cleared)
    except ValidationError as exc:
        error = exc.errors()[0]
        loc = ".".join(str(part) for part in error["loc"])
        if error["type"] == "extra_forbidden":
            known = ", ".join(sorted(model.model_fields))
            raise InvalidSettings(f"{where}.{loc}", f"unknown setting; known settings are {known}") from None
        message = str(error["msg"]).removeprefix("Value error, ")
        raise InvalidSettings(f"{where}.{loc}", message) from None
