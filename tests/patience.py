"""Timeouts in tests that a loaded machine cannot turn into false failures.

A test of a timeout needs the command to have started (printed its first line, touched its marker)
before the timeout kills it, and no fixed timeout guarantees that on a busy machine. So the test runs
its attempt with a short timeout and, when the result shows the command had not started yet, again
with twice the timeout, up to a bound: a loaded machine costs time, never a wrong verdict, and what
the test then asserts (exit 124, the output up to the kill, nothing left running) is guaranteed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

FIRST_S = 1.0
LIMIT_S = 64.0


def until_started(attempt: Callable[[float], T], started: Callable[[T], bool], *, first: float = FIRST_S,
                  limit: float = LIMIT_S) -> T:
    """``attempt(timeout)`` with timeouts doubling from ``first`` until ``started(result)``; the
    result of the first attempt whose command had started. Fails if none had by ``limit``."""
    timeout = first
    while True:
        result = attempt(timeout)
        if started(result):
            return result
        assert timeout < limit, f"the command never started within a {timeout:g} s timeout"
        timeout *= 2


def read_until(fd: int, needle: bytes, timeout: float = 60.0, seen: bytes = b"") -> bytes:
    """Read ``fd`` until ``needle`` has come (all read so far, ``seen`` first), failing with what
    came once ``timeout`` passes: never a read that blocks past it."""
    import os
    import select
    import time

    deadline = time.monotonic() + timeout
    while needle not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"{needle!r} never came; read: {seen[-2000:]!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 4096)
            assert chunk, f"end of file before {needle!r}; read: {seen[-2000:]!r}"
            seen += chunk
    return seen
