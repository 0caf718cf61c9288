"""The CLI's configuration file and how flags, the file and defaults combine.

The file is TOML, at ``--config PATH``, else ``$HERMES_SANDBOXES_CONFIG``, else
``$XDG_CONFIG_HOME/hermes-sandboxes/config.toml`` (``~/.config/...``); a missing file is fine::

    backend = "local"            # the default backend (--backend and $HERMES_SANDBOXES_BACKEND win)

    [local]                      # one table per backend: that backend's settings
    home = "/var/lib/hermes-sandboxes"
    network = "loopback"
    auto_checkpoint = "risky"

    [sprites]
    image = "ubuntu:24.04"

Precedence: flags (``--backend``, ``-o KEY=VALUE``, the command's own options) over the file, the
file over defaults. Values given with ``-o`` are read as YAML scalars (``retention=5`` is a number,
``network=loopback`` text). Every setting is validated by the backend's settings model: a bad value
is one error naming ``<file>: [<backend>].<key>`` and why.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermes_sandboxes import backends
from hermes_sandboxes.errors import InvalidInput
from hermes_sandboxes.settings import BackendSettings, InvalidSettings

CONFIG_ENV = "HERMES_SANDBOXES_CONFIG"
BACKEND_ENV = "HERMES_SANDBOXES_BACKEND"


def default_config_path() -> Path:
    explicit = os.environ.get(CONFIG_ENV)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CONFIG_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".config"
    return base / "hermes-sandboxes" / "config.toml"


@dataclass(frozen=True)
class Effective:
    """The chosen backend, its validated settings, and the file they came from (if any)."""

    backend: str
    settings: BackendSettings
    path: Path
    file_found: bool


def read_file(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        return {}
    except tomllib.TOMLDecodeError as exc:
        raise InvalidSettings(str(path), f"cannot be parsed: {exc}") from None
    except OSError as exc:
        raise InvalidSettings(str(path), f"cannot be read ({exc.strerror})") from None
    return data


def parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs from ``-o``, values read as YAML scalars or lists."""
    import yaml

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InvalidInput(f"-o takes KEY=VALUE, got {pair!r}")
        try:
            out[key.strip()] = yaml.safe_load(value) if value.strip() else None
        except yaml.YAMLError:
            out[key.strip()] = value
    return out


def load(backend: str | None, path: str | os.PathLike[str] | None = None,
         overrides: Mapping[str, Any] | None = None) -> Effective:
    """The effective backend and settings: ``overrides`` over the file over defaults."""
    config_path = Path(path) if path is not None else default_config_path()
    data = read_file(config_path)
    chosen = backend or data.get("backend") or backends.DEFAULT_BACKEND
    if not isinstance(chosen, str):
        raise InvalidSettings(f"{config_path}: backend", f"expected a backend name, got {chosen!r}")
    backends.entry(chosen)  # unknown name: one line listing the known ones
    table = data.get(chosen) or {}
    if not isinstance(table, Mapping):
        raise InvalidSettings(f"{config_path}: [{chosen}]", "expected a table of settings")
    merged = {**table, **(overrides or {})}
    settings = backends.validate(chosen, merged, where=f"{config_path}: [{chosen}]")
    return Effective(chosen, settings, config_path, config_path.exists())
