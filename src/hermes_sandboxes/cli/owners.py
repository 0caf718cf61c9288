"""Who owns each ``run`` sandbox, so that one whose owner died (kill -9 included) is collected.

Before ``run`` creates its ephemeral sandbox it writes ``<state>/<backend key>/owners/<name>.json``
with its pid and that process's start time (from /proc: a pid the kernel reused for another
process does not count as the owner); it removes the file once the sandbox is destroyed. A record
whose process is gone names an orphan: the next CLI call that reaches the backend, or ``gc``,
destroys it. The record is written first, so there is no moment when the sandbox exists unowned.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from hermes_sandboxes.recorder.liveness import start_time


class Owners:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, name: str) -> Path:
        return self.directory / f"{name}.json"

    def claim(self, name: str) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        pid = os.getpid()
        tmp = self.directory / f".{name}.{pid}.tmp"
        tmp.write_text(json.dumps({"pid": pid, "start": start_time(pid)}))
        os.replace(tmp, self._path(name))

    def release(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(name).unlink()

    def orphans(self) -> list[str]:
        """Sandboxes whose owning process is gone."""
        try:
            entries = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        found = []
        for entry in sorted(entries):
            if entry.startswith(".") or not entry.endswith(".json"):
                continue
            try:
                owner = json.loads((self.directory / entry).read_text())
                alive = owner["start"] is not None and start_time(int(owner["pid"])) == owner["start"]
            except (OSError, ValueError, KeyError, TypeError):
                alive = False  # unreadable: its writer died mid-write, before it created anything
            if not alive:
                found.append(entry.removesuffix(".json"))
        return found
