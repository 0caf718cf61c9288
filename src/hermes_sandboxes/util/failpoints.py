"""Failpoints: named places where a test can stop an operation of ours mid-way, to kill it there
and check what the next call makes of it (a checkpoint staged but not published, a restore half
applied, a migration between its steps).

``pause(point)`` does nothing unless ``$HERMES_SANDBOXES_TEST_PAUSE`` names that point; then it
writes this process's pid to ``$HERMES_SANDBOXES_TEST_PAUSE_MARKER`` (when set), so the test knows
the operation got there, and sleeps until it is killed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

PAUSE_ENV = "HERMES_SANDBOXES_TEST_PAUSE"
MARKER_ENV = "HERMES_SANDBOXES_TEST_PAUSE_MARKER"


def pause(point: str) -> None:
    """Stop here (until killed) when a test asked for ``point``; no effect otherwise."""
    if os.environ.get(PAUSE_ENV) == point:
        marker = os.environ.get(MARKER_ENV)
        if marker:
            Path(marker).write_text(str(os.getpid()))
        time.sleep(3600)
