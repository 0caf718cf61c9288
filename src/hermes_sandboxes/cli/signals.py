"""How the CLI ends on a signal: SIGINT, SIGTERM and SIGHUP all unwind like Ctrl-C.

``install()`` makes each of them raise ``Stopped`` (a ``KeyboardInterrupt``, so every clean-up
written for Ctrl-C runs for a closed terminal or a supervisor's SIGTERM too) in the main thread.
The CLI then exits with the shell's convention, 128 + the signal's number (130, 143, 129).
A SIGHUP the CLI was started with ignored stays ignored, as ``nohup`` expects: the call (and its
command) outlives the terminal that started it. The warm client keeps it so too (warm.py).

``held()`` delays them over a stretch that must not be cut in two (starting a command, which the
sandbox may already run before we hold its handle; journaling how it ended; destroying a ``run``
sandbox): a signal that arrives inside is raised when the stretch ends. This module imports only
the standard library: it is on the hot path of every ``exec``.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# an inherited SIG_IGN for these is left alone (nohup ignores SIGHUP so that the command survives a
# hang-up: a program that catches it again undoes what nohup is for)
KEPT_IGNORED = (signal.SIGHUP,)


class Stopped(KeyboardInterrupt):
    """The CLI was told to stop by signal ``signum``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _State:
    depth = 0  # nesting of held()
    pending: list[int] = []  # noqa: RUF012 - one per process, on purpose
    last: int | None = None  # the last signal received, for exits that lost the exception (click.Abort)


def _handler(signum: int, frame: FrameType | None) -> None:
    _State.last = signum
    if _State.depth:
        _State.pending.append(signum)
        return
    raise Stopped(signum)


def install() -> Callable[[], None]:
    """Route SIGINT, SIGTERM and SIGHUP through ``Stopped`` (but an ignored SIGHUP, which stays
    ignored: ``KEPT_IGNORED``); returns what puts the old handlers back (the CLI runs inside test
    processes too)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {sig: signal.signal(sig, _handler) for sig in SIGNALS
                if not (sig in KEPT_IGNORED and signal.getsignal(sig) == signal.SIG_IGN)}

    def restore() -> None:
        for sig, handler in previous.items():
            if handler is not None:  # None: installed outside Python, cannot be put back
                signal.signal(sig, handler)
        _State.pending.clear()
        _State.depth = 0
        _State.last = None

    return restore


def last() -> int | None:
    return _State.last


def exit_code(exc: BaseException) -> int:
    """128 + the signal that stopped us (130 for a plain KeyboardInterrupt)."""
    signum = exc.signum if isinstance(exc, Stopped) else (_State.last or signal.SIGINT)
    return 128 + int(signum)


def name(exc: BaseException) -> str:
    signum = exc.signum if isinstance(exc, Stopped) else (_State.last or signal.SIGINT)
    return signal.Signals(signum).name


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Signals that arrive inside the block are raised as ``Stopped`` when it ends (unless it ends
    with an exception of its own, which then goes on)."""
    _State.depth += 1
    ok = False
    try:
        yield
        ok = True
    finally:
        _State.depth -= 1
        if _State.depth == 0 and _State.pending:
            signum = _State.pending[0]
            _State.pending.clear()
            if ok:
                raise Stopped(signum)
