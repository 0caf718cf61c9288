"""When a Hermes environment's cleanup runs, and how it gets through failures.

Hermes asks for cleanup from several places: after a turn, from its idle reaper (a thread of its
own, possibly while a long command still runs), at exit, and by finalising an environment nobody
holds. The rules, the same for every backend:

* cleanup asked for while a command runs is deferred: it runs once the last running command has
  ended (on a thread of its own, so that command's result is not held up); ``wait()`` waits for
  it, which Hermes does at exit through ``wait_for_cleanup``;
* a second request is a no-op, and new commands are refused once cleanup was asked for;
* every step runs even when an earlier one failed. An ordinary failure is logged; a
  KeyboardInterrupt, SystemExit or GeneratorExit is held until every step has run, then raised
  again, so Ctrl-C during a pull-back still releases the lease and destroys an ephemeral sandbox
  and still stops the program.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import threading
from collections.abc import Callable, Iterator, Sequence

from hermes_sandboxes.errors import SandboxError

logger = logging.getLogger(__name__)

_CONTROL = (KeyboardInterrupt, SystemExit, GeneratorExit)

Step = tuple[str, Callable[[], object]]


class GateClosed(SandboxError):
    """A command was started after cleanup was asked for."""


class _State(enum.Enum):
    OPEN = "open"
    REQUESTED = "requested"  # asked for while commands run: deferred
    CLOSING = "closing"
    CLOSED = "closed"


def run_steps(steps: Sequence[Step], sandbox: str) -> None:
    """Run every step; log ordinary failures; raise the first control exception at the end."""
    held: BaseException | None = None
    for what, step in steps:
        try:
            step()
        except _CONTROL as exc:
            held = held or exc
        except Exception:
            logger.warning("sandbox %s: cleanup could not %s", sandbox, what, exc_info=True)
    if held is not None:
        raise held


class CommandGate:
    """The running commands of one environment and the cleanup that waits for them."""

    def __init__(self, teardown: Callable[[], None], name: str) -> None:
        self._teardown = teardown
        self._name = name
        self._cond = threading.Condition()
        self._running = 0
        self._state = _State.OPEN

    @property
    def closed(self) -> bool:
        """Cleanup was asked for (it may still be waiting for a command, or running)."""
        return self._state is not _State.OPEN

    @contextlib.contextmanager
    def command(self) -> Iterator[None]:
        """Hold the gate open for one command; GateClosed once cleanup was asked for."""
        with self._cond:
            if self._state is not _State.OPEN:
                raise GateClosed(f"the environment of sandbox {self._name} was cleaned up")
            self._running += 1
        try:
            yield
        finally:
            with self._cond:
                self._running -= 1
                state: _State = self._state  # (cleanup may have been asked for meanwhile)
                due = self._running == 0 and state is _State.REQUESTED
                if due:
                    self._state = _State.CLOSING
            if due:
                threading.Thread(target=self._quietly, name=f"sandbox-cleanup-{self._name}", daemon=True).start()

    def close(self) -> None:
        """Ask for cleanup: now when no command runs, else once the last one ends. Repeats are no-ops."""
        with self._cond:
            if self._state is not _State.OPEN:
                return
            if self._running:
                logger.info("sandbox %s: cleanup deferred until the running command ends", self._name)
                self._state = _State.REQUESTED
                return
            self._state = _State.CLOSING
        self._run()

    def finalise(self) -> bool:
        """Claim the cleanup for a finaliser (nothing runs now, nothing was asked): True when claimed."""
        with self._cond:
            if self._state is not _State.OPEN or self._running:
                return False
            self._state = _State.CLOSED
            self._cond.notify_all()
            return True

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until no cleanup is pending or running; False when ``timeout`` ran out first."""
        with self._cond:
            return self._cond.wait_for(lambda: self._state in (_State.OPEN, _State.CLOSED), timeout)

    def _run(self) -> None:
        try:
            self._teardown()
        finally:
            with self._cond:
                self._state = _State.CLOSED
                self._cond.notify_all()

    def _quietly(self) -> None:
        try:
            self._run()
        except BaseException:  # a thread of its own: nobody to hand a Ctrl-C to, nothing to stop
            logger.warning("sandbox %s: deferred cleanup failed", self._name, exc_info=True)
