"""The validated effective settings, remembered so that ``exec`` need not import pydantic to know them.

Validating the config file costs the settings models (pydantic) on every call; ``exec`` is called
per command by scripts and agents. So the full CLI, having validated, writes the result here and
the fast path (fastpath/inprocess.py) reads it back, keyed by everything validation depends on: the config
file's path, size, mtime and inode (or its absence), the backend named by flag or environment, the
``-o``/``--home`` overrides, the core count (``cpus`` is checked against it) and the code that
validates (the package's settings modules' mtimes). Any change is a miss, and a miss means the
full CLI runs and validates again. Kept in ``<state>/settings-cache.json``, a few entries at most.
Only the standard library (and the digest of names.py, the ownership check of util/ownership.py) is imported here.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

from hermes_sandboxes.names import digest
from hermes_sandboxes.util import ownership

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the hot path of a CLI exec)
if TYPE_CHECKING:
    from typing import Any

MAX_ENTRIES = 8
_CODE = ("settings.py", "cli/config.py", "backends/local/settings.py")  # what validation reads


def config_path(explicit: str | None) -> Path:
    """Where the config file is (the same rule as config.default_config_path, without its imports)."""
    if explicit:
        return Path(explicit)
    env = os.environ.get("HERMES_SANDBOXES_CONFIG")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CONFIG_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".config"
    return base / "hermes-sandboxes" / "config.toml"


def _stamp(path: Path) -> list[int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def key(backend: str | None, config: str | None, overrides: Mapping[str, Any]) -> str:
    path = config_path(config)
    package = Path(__file__).resolve().parent.parent
    parts = {
        "config": str(path), "stamp": _stamp(path),
        "backend": backend or os.environ.get("HERMES_SANDBOXES_BACKEND") or None,
        "overrides": sorted((k, repr(v)) for k, v in overrides.items()),
        "cores": os.cpu_count(), "code": [_stamp(package / name) for name in _CODE],
    }
    return digest(json.dumps(parts, sort_keys=True), 32)


def _file(state_root: Path) -> Path:
    return state_root / "settings-cache.json"


def lookup(state_root: Path, cache_key: str) -> tuple[str, dict[str, Any]] | None:
    """(backend name, validated settings values), or None on a miss."""
    try:
        entry = json.loads(_file(state_root).read_text()).get(cache_key)
        return str(entry["backend"]), dict(entry["values"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def store(state_root: Path, cache_key: str, backend: str, values: Mapping[str, Any]) -> None:
    """Remember one validated result; never fails the command it serves."""
    path = _file(state_root)
    with contextlib.suppress(OSError, ValueError, TypeError):
        try:
            entries = json.loads(path.read_text())
            if not isinstance(entries, dict):
                entries = {}
        except (OSError, ValueError):
            entries = {}
        entries.pop(cache_key, None)
        entries[cache_key] = {"backend": backend, "values": dict(values)}
        while len(entries) > MAX_ENTRIES:
            entries.pop(next(iter(entries)))
        try:  # a state directory someone else controls gets nothing from us (util/ownership.py)
            ownership.ensure_dir(path.parent, "the host state directory")
        except ownership.Untrusted:
            return
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(entries))
        os.replace(tmp, path)
