"""Reading this plugin's settings from the active Hermes profile's config.yaml.

We parse config.yaml ourselves instead of only asking ``ctx.get_config``: when the file cannot be
parsed, Hermes carries on with a fallback copy of the config that may lack the settings the user just
wrote, and a sandbox created from defaults (another name prefix, scope or network) is worse than no
sandbox. So an unparseable file is an ``InvalidSettings`` error naming config.yaml and the parser's
reason, like any invalid value.
"""

from __future__ import annotations

import importlib
import threading
from pathlib import Path
from typing import Any, TypeVar

import yaml

from hermes_sandboxes.hermes.sync.archive import MAX_ARCHIVE_BYTES
from hermes_sandboxes.settings import BackendSettings, InvalidSettings, validate_settings

S = TypeVar("S", bound=BackendSettings)

_cache: dict[tuple[str, str, int, int], Any] = {}
_cache_lock = threading.Lock()


def active_hermes_home() -> Path:
    constants = importlib.import_module("hermes_constants")
    return Path(constants.get_hermes_home())


SYNC_BACK_MAX_BYTES_KEY = "terminal.sync_back_max_bytes"


def sync_back_max_bytes() -> int:
    """Hermes's cap on an archive of the sandbox's ``~/.hermes`` (``terminal.sync_back_max_bytes``,
    2 GiB by default), read from the active profile's config as Hermes reads it: our pull and
    recovery archives are cut off at the same size, so Hermes never gets one it would refuse. A
    value that is not a whole number of bytes (0 or more) is InvalidSettings naming the key: a cap
    the user meant to lower must not silently become 2 GiB."""
    from hermes_cli.config import load_config

    raw = ((load_config() or {}).get("terminal") or {}).get(SYNC_BACK_MAX_BYTES_KEY.split(".")[1])
    if raw is None:
        return MAX_ARCHIVE_BYTES
    if isinstance(raw, bool) or not isinstance(raw, int | float | str) or (
            isinstance(raw, float) and not raw.is_integer()):
        raise InvalidSettings(SYNC_BACK_MAX_BYTES_KEY, f"{raw!r} is not a whole number of bytes")
    try:
        value = int(raw)
    except ValueError:
        raise InvalidSettings(SYNC_BACK_MAX_BYTES_KEY, f"{raw!r} is not a whole number of bytes") from None
    if value < 0:
        raise InvalidSettings(SYNC_BACK_MAX_BYTES_KEY, f"{value} is negative")
    return value


def settings_path(plugin_id: str) -> str:
    return f"plugins.entries.{plugin_id}.settings"


def load_settings(model: type[S], plugin_id: str, home: Path | None = None) -> S:
    """The validated settings of ``plugin_id`` in the active profile, or InvalidSettings."""
    config = (home or active_hermes_home()) / "config.yaml"
    try:
        stat = config.stat()
    except FileNotFoundError:
        return validate_settings(model, None, where=settings_path(plugin_id))
    key = (f"{model.__qualname__}:{plugin_id}", str(config), stat.st_mtime_ns, stat.st_size)
    with _cache_lock:
        cached = _cache.get(key)
    if isinstance(cached, model):
        return cached
    settings = validate_settings(model, _raw_settings(config, plugin_id), where=settings_path(plugin_id))
    with _cache_lock:
        if len(_cache) > 64:
            _cache.clear()
        _cache[key] = settings
    return settings


def _raw_settings(config: Path, plugin_id: str) -> object:
    try:
        data = yaml.safe_load(config.read_text(encoding="utf-8-sig"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise InvalidSettings(
            str(config),
            f"cannot be parsed ({problem}{where}); fix the file, Hermes is running on a fallback config",
        ) from None
    except OSError as exc:
        raise InvalidSettings(str(config), f"cannot be read ({exc.strerror})") from None
    path = ["plugins", "entries", plugin_id]
    node: object = data
    for depth, part in enumerate(path):
        if node is None:
            return None
        if not isinstance(node, dict):
            raise InvalidSettings(".".join(path[:depth]) or "config.yaml", "expected a mapping")
        node = node.get(part)
    if node is None:
        return None
    if not isinstance(node, dict):
        raise InvalidSettings(".".join(path), "expected a mapping")
    return node.get("settings")
