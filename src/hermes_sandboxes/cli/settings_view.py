"""What ``config`` shows: every effective setting, the value in force and where it came from.

A setting nobody set shows the value the backend will use (the store of the local backend comes
from ``$HERMES_SANDBOXES_HOME`` when that is set, else its default directory), and sizes are shown
for people (``2.0 GiB``); ``--json`` keeps them in bytes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hermes_sandboxes.cli.config import DEFAULT_SOURCE, Effective

STORE_HOME_ENV = "HERMES_SANDBOXES_HOME"


def view(effective: Effective, state_dir: Path) -> dict[str, Any]:
    """The JSON of ``config --json``: backend, file, state directory, settings and their sources."""
    settings = effective.settings.display()
    sources = {key: effective.sources.get(key, DEFAULT_SOURCE) for key in settings if key != "backend"}
    store_home = getattr(effective.settings, "store_home", None)
    if callable(store_home) and settings.get("home") is None:  # the local backend's store: say which
        settings["home"] = str(store_home())
        sources["home"] = f"${STORE_HOME_ENV}" if os.environ.get(STORE_HOME_ENV) else DEFAULT_SOURCE
    return {"backend": effective.backend, "backend_source": effective.backend_source,
            "config_file": str(effective.path), "config_file_found": effective.file_found,
            "state_dir": str(state_dir), "settings": {k: v for k, v in settings.items() if k != "backend"},
            "sources": sources}


def rows(effective: Effective, data: dict[str, Any]) -> list[list[str]]:
    """The table of ``config``: sizes for people."""
    found = "" if data["config_file_found"] else " (not found: defaults apply)"
    sizes = _size_keys(effective)
    return [["backend", data["backend"], data["backend_source"]],
            ["config file", f"{data['config_file']}{found}", ""],
            ["state directory", data["state_dir"], ""],
            *([key, _text(value, key in sizes), data["sources"][key]] for key, value in data["settings"].items())]


def _size_keys(effective: Effective) -> set[str]:
    """The settings given in bytes (their description says so: memory, disk)."""
    fields = type(effective.settings).model_fields
    return {name for name, info in fields.items() if (info.description or "").startswith("bytes")}


def _text(value: Any, size: bool = False) -> str:
    from hermes_sandboxes.ui.output import human_size

    if size and isinstance(value, int):
        return human_size(value)
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value) or "-"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "-"
    return "-" if value is None else str(value)
