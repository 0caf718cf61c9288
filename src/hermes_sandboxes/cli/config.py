"""The CLI's configuration file and how flags, the file and defaults combine.

The file is TOML, at ``--config PATH``, else ``$HERMES_SANDBOXES_CONFIG``, else
``$XDG_CONFIG_HOME/hermes-sandboxes/config.toml`` (``~/.config/...``); only that default may be
missing (a file named by flag or variable that does not exist is an error: a typo would otherwise
quietly change the network, the limits and the store)::

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
is one error naming where the value was written (``-o network=wifi``, ``--home DIR``,
``$HERMES_SANDBOXES_BACKEND=x``, ``<file>: [<backend>].<key>``) and why.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hermes_sandboxes import backends
from hermes_sandboxes.errors import InvalidInput
from hermes_sandboxes.settings import BackendSettings, InvalidOption, InvalidSettings

CONFIG_ENV = "HERMES_SANDBOXES_CONFIG"
BACKEND_ENV = "HERMES_SANDBOXES_BACKEND"


DEFAULT_SOURCE = "default"


def default_config_path() -> Path:
    return config_file(None)[0]


def config_file(explicit: str | os.PathLike[str] | None) -> tuple[Path, str | None]:
    """The config file and what named it (``--config`` or the variable; None: the default path,
    the only one that may be missing)."""
    if explicit is not None:
        return Path(explicit), "--config"
    named = os.environ.get(CONFIG_ENV)
    if named:
        return Path(named), f"${CONFIG_ENV}="
    xdg = os.environ.get("XDG_CONFIG_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".config"
    return base / "hermes-sandboxes" / "config.toml", None


@dataclass(frozen=True)
class Effective:
    """The chosen backend, its validated settings, the file they came from (if any), and where
    each setting's value came from (``sources``: key -> "-o network", "--home", "<file> [local]",
    "$HERMES_SANDBOXES_HOME" or "default"; ``backend_source`` likewise)."""

    backend: str
    settings: BackendSettings
    path: Path
    file_found: bool
    sources: Mapping[str, str] = field(default_factory=dict)
    backend_source: str = DEFAULT_SOURCE


def read_file(path: Path, named_by: str | None = None) -> dict[str, Any]:
    """The file's tables; a missing file is empty only when nobody named it."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        if named_by is None:
            return {}
        where = f"{named_by}{'' if named_by.endswith('=') else ' '}{path}"
        invalid = InvalidOption if named_by == "--config" else InvalidSettings  # the flag: bad usage, exit 2
        raise invalid(where, "no such file (only the default config file may be missing)") from None
    except IsADirectoryError:
        raise InvalidSettings(str(path), "is a directory, not a TOML file") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidSettings(str(path), f"cannot be parsed as TOML: {exc}") from None
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
            raise InvalidOption(f"-o {pair}", "-o takes KEY=VALUE")
        try:
            out[key.strip()] = yaml.safe_load(value) if value.strip() else None
        except yaml.YAMLError:
            out[key.strip()] = value
    return out


def _backend_choice(flag: str | None, data: Mapping[str, Any], path: Path) -> tuple[str, str]:
    """The backend's name and what chose it: --backend, the variable, the file, or the default."""
    if flag:
        chosen, source = flag, "--backend"
    elif os.environ.get(BACKEND_ENV):
        chosen = os.environ[BACKEND_ENV]
        source = f"${BACKEND_ENV}={chosen}"
    elif "backend" in data:
        chosen, source = data["backend"], f"{path}: backend"
    else:
        return backends.DEFAULT_BACKEND, DEFAULT_SOURCE
    invalid = InvalidOption if source == "--backend" else InvalidSettings  # the flag: bad usage, exit 2
    if not isinstance(chosen, str):
        raise invalid(source, f"expected a backend name in quotes, got {chosen!r}")
    try:
        backends.entry(chosen)
    except InvalidInput as exc:  # unknown: one line listing the known ones, naming where it was written
        raise invalid(source, str(exc)) from None
    return chosen, source


def load(backend: str | None, path: str | os.PathLike[str] | None = None,
         overrides: Mapping[str, Any] | None = None, labels: Mapping[str, str] | None = None) -> Effective:
    """The effective backend and settings: ``overrides`` over the file over defaults. ``labels``
    names where each override came from (default ``-o KEY``), for errors and ``config``."""
    config_path, named_by = config_file(path)
    data = read_file(config_path, named_by)
    chosen, backend_source = _backend_choice(backend, data, config_path)
    table = data.get(chosen) or {}
    if not isinstance(table, Mapping):
        raise InvalidSettings(f"{config_path}: [{chosen}]", "expected a table of settings")
    given = {k: v for k, v in (overrides or {}).items()}
    sources = {key: f"{config_path} [{chosen}]" for key in table}
    sources.update({key: (labels or {}).get(key, f"-o {key}") for key in given})
    try:
        settings = backends.validate(chosen, {**table, **given}, where="")
    except InvalidSettings as exc:
        key = exc.key.removeprefix(".")
        top = key.split(".", 1)[0]
        if top in given:
            label = (labels or {}).get(top, f"-o {top}")
            value = given[top]
            where = f"{label}={value}" if label.startswith("-o") else f"{label} {value}"
            raise InvalidOption(where, exc.reason) from None
        raise InvalidSettings(f"{config_path}: [{chosen}].{key}", exc.reason) from None
    return Effective(chosen, settings, config_path, config_path.exists(), sources, backend_source)
