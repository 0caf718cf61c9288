"""Ctrl-C in tests, whatever SIGINT disposition the suite itself was started with.

A shell without job control starts a background job (``pytest ... &`` in a script) with SIGINT
ignored, and an ignored signal stays ignored across fork and exec: a child that a test interrupts
would never see its SIGINT (a Python child does not even install its KeyboardInterrupt handler), and
a test that interrupts its own process would never get its KeyboardInterrupt. So:

- a child started to be interrupted (or driven from a terminal, where Ctrl-C is a key) is started as
  ``interruptible(argv)``: coreutils' ``env --default-signal=INT,HUP`` puts SIGINT (and SIGHUP, which
  ``nohup`` ignores and the CLI then keeps ignored) back to their defaults
  and execs the command in place (the same pid, and no Python code between fork and exec, which
  ``preexec_fn`` would run in a process that has threads);
- a test that sends SIGINT to itself does it inside ``with sigint_raises():``.

A shell with job control, or a terminal, starts the suite with SIGINT at its default: there both are
no-ops, and the tests mean the same.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator, Sequence
from typing import TypeVar

T = TypeVar("T", bound=str | bytes)

DEFAULT_SIGINT = ("env", "--default-signal=INT,HUP")


def interruptible(argv: Sequence[T]) -> list[T | str]:
    """``argv`` run with SIGINT and SIGHUP at their defaults, as a foreground command of an
    interactive shell (the CLI keeps an ignored SIGHUP ignored, as under nohup: a suite started
    under nohup would otherwise never see the hang-ups its tests send)."""
    return [*DEFAULT_SIGINT, *argv]


@contextlib.contextmanager
def sigint_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt in this process inside the block (as in an interpreter started
    with SIGINT at its default); what it did before is put back after."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)
