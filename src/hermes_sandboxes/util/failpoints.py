"""Failpoints: named places where a test can stop an operation of ours mid-way, to kill it there
and check what the next call makes of it (a checkpoint staged but not published, a restore half
applied, a migration between its steps).

``pause(point)`` does nothing unless ``$HERMES_SANDBOXES_TEST_PAUSE`` names that point; then it
writes this process's pid to ``$HERMES_SANDBOXES_TEST_PAUSE_MARKER`` (when set), so the test knows
the operation got there, and sleeps until it is killed; or, when ``$HERMES_SANDBOXES_TEST_RESUME``
names a FIFO, until the test has opened that FIFO and closed it again (then the operation goes on:
the test orders what happens meanwhile by events, not by time).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

PAUSE_ENV = "HERMES_SANDBOXES_TEST_PAUSE"
MARKER_ENV = "HERMES_SANDBOXES_TEST_PAUSE_MARKER"
RESUME_ENV = "HERMES_SANDBOXES_TEST_RESUME"


def pause(point: str) -> None:
    """Stop here (until killed, or resumed) when a test asked for ``point``; no effect otherwise."""
    if os.environ.get(PAUSE_ENV) == point:
        marker = os.environ.get(MARKER_ENV)
        if marker:
            Path(marker).write_text(str(os.getpid()))
        resume = os.environ.get(RESUME_ENV)
        if resume:
            with open(resume, "rb") as fifo:  # blocks until the test opens it to write
                fifo.read()  # and returns once it closed it
            return
        time.sleep(3600)
