"""One command in a sandbox as ``exec`` and ``run`` run it: the recorder's ``start()`` and our own wait.

- stdin is streamed in when it is not a terminal (or with ``-i``), with its end-of-file;
- stdout and stderr are written through as they arrive; when our reader goes away
  (``exec box -- yes | head``) the command is killed, as SIGPIPE would kill it in a pipeline, and
  we exit 141 quietly;
- the automatic checkpoint is taken by the recorder and announced (its ``on_checkpoint``) before
  the command starts;
- whatever ends the wait (the command, its timeout, Ctrl-C, SIGTERM, SIGHUP, a lost sandbox), the
  command and what it started are killed and the end is journaled once, with why. Signals are held
  while the command starts (the sandbox may run it before we hold its handle) and while its end is
  recorded, so neither can be cut in two.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable

from hermes_sandboxes.cli import signals
from hermes_sandboxes.cli.session import Session, recorder_policy
from hermes_sandboxes.errors import SandboxError
from hermes_sandboxes.recorder.command import RecordedProcess
from hermes_sandboxes.recorder.sandbox import StoriedCheckpoint
from hermes_sandboxes.sandbox import TIMEOUT_EXIT_CODE, Capability, Command, OutputSink
from hermes_sandboxes.util.values import dataclass

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the hot path of a CLI exec)
if TYPE_CHECKING:
    from typing import Any, BinaryIO

    from hermes_sandboxes.cli.session import CliPolicy
    from hermes_sandboxes.risk import RiskVerdict
    from hermes_sandboxes.sandbox import Stdin

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a pipeline member SIGPIPE killed
BROKEN_PIPE = "its output's reader went away (broken pipe)"


@dataclass(frozen=True)
class Outcome:
    exit_code: int
    timed_out: bool = False
    broken_pipe: bool = False
    out_of_memory: bool = False  # SIGKILLed by the sandbox's memory limit


def stdin_for(interactive: bool) -> Stdin:
    """Our stdin, to stream into the command, unless it is a terminal and ``-i`` was not given
    (then the command reads end-of-file, as with ``docker exec`` without ``-i``)."""
    stream = sys.stdin
    if stream is None or stream.closed:
        return None
    try:
        if stream.isatty() and not interactive:
            return None
    except ValueError:
        return None
    binary: BinaryIO | None = getattr(stream, "buffer", None)
    # the unbuffered file under it: a buffered reader holds its lock while a read blocks, and the
    # interpreter, closing stdin at exit, then aborts (exit 134) if the command never read its
    # stdin (`sleep 3 | exec box -- true`); nothing read stdin before, so no byte is left behind
    raw: BinaryIO | None = getattr(binary, "raw", binary)
    return raw


class Passthrough:
    """Writes the command's output through to ours; a write that fails kills the command."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.broken = False
        self.proc: RecordedProcess | None = None

    def sink(self, stream: Any) -> OutputSink:
        binary: BinaryIO = getattr(stream, "buffer", stream)

        def write(chunk: bytes) -> None:
            with self._lock:
                if self.broken:
                    return
                try:
                    binary.write(chunk)
                    binary.flush()
                    return
                except (BrokenPipeError, ValueError, OSError):  # ValueError: the stream was closed
                    self.broken = True
                    proc = self.proc
            if proc is not None:  # else attach() kills it: output can come before start() returns
                proc.kill(BROKEN_PIPE)

        return write

    def attach(self, proc: RecordedProcess) -> None:
        with self._lock:
            self.proc = proc
            broken = self.broken
        if broken:
            proc.kill(BROKEN_PIPE)


def run_command(session: Session, command: Command, *, policy: CliPolicy, cwd: str | None,
                env: dict[str, str], timeout: float | None, stdin: Stdin,
                announce: Callable[[StoriedCheckpoint, RiskVerdict, bool], None]) -> Outcome:
    """Run ``command`` to its end; see the module's docstring for what every ending does."""
    output = Passthrough()
    proc: RecordedProcess | None = None
    try:
        with signals.held():  # a signal now is raised once we hold the command, so we can kill it
            proc = session.recorded.start(
                command, checkpoint=recorder_policy(policy),
                on_checkpoint=announce,  # new False: an earlier one reused (even for this same command line)
                cwd=cwd, env=env, stdin=stdin,
                on_stdout=output.sink(sys.stdout), on_stderr=output.sink(sys.stderr))
            output.attach(proc)
        code = _wait(proc, timeout)
    except SandboxError:
        raise  # the recorded process journaled it (or the command never started)
    except BaseException as exc:  # a signal (Stopped, KeyboardInterrupt): stop the command first
        if proc is not None:
            with signals.held():
                proc.stop(f"interrupted by {signals.name(exc)}")
        raise
    with signals.held():
        if code is None:
            proc.stop(None, timed_out=True)
            return Outcome(TIMEOUT_EXIT_CODE, timed_out=True)
        proc.finish(code)
    if output.broken:
        _silence_stdout()
        return Outcome(EXIT_BROKEN_PIPE, broken_pipe=True)
    return Outcome(code, out_of_memory=proc.out_of_memory)


WAIT_SLICE_S = 0.25


def _wait(proc: RecordedProcess, timeout: float | None) -> int | None:
    """The command's exit code, or None at ``timeout``; waited for in short slices. The kernel may
    hand SIGINT, SIGTERM or SIGHUP to any of our threads (the output pump, say), and Python runs
    the handler only when the main thread runs Python code again: a wait without end would sit on
    the signal until the command ended by itself (found hung after a SIGTERM, with sleep 600)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = WAIT_SLICE_S if deadline is None else min(WAIT_SLICE_S, max(0.0, deadline - time.monotonic()))
        code = proc.wait(left, record=False)  # recorded by the caller, signals held
        if code is not None or (deadline is not None and time.monotonic() >= deadline):
            return code


Note = Callable[..., None]  # (text, style=None): a note for people on stderr


def announcer(note: Note, name: str) -> Callable[[StoriedCheckpoint, RiskVerdict, bool], None]:
    """The automatic-checkpoint note, said before the command starts (an endless or interrupted
    command has still told the user how to undo it). ``fresh``: taken for this command, rather than
    an earlier one reused because nothing changed since (the note must not claim it was just taken)."""

    def announce(taken: StoriedCheckpoint, verdict: RiskVerdict, new: bool) -> None:
        why = f" ({', '.join(verdict.reasons)})" if verdict.reasons else ""
        first = "taken first" if new else "kept as the undo point, nothing changed since"
        note(f"checkpoint {taken.id} {first}{why}; undo with: "
             f"hermes-sandboxes checkpoint restore {name} {taken.id}")

    return announce


def finish(note: Note, session: Session, outcome: Outcome, timeout: float | None) -> int:
    """The exit code, after saying what the user must know (a timeout and what it killed)."""
    if outcome.broken_pipe:
        return outcome.exit_code
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
    if outcome.out_of_memory:
        limit = _memory_limit(session)
        note(f"killed for memory: the command reached the sandbox's memory limit{limit} (exit 137); "
             "give the sandbox more with --memory when creating it", style="yellow")
    if outcome.timed_out:
        tree = Capability.TREE_KILL in session.sandbox.backend.capabilities
        what = ("the command and every process it started were killed" if tree
                else "the command was killed; processes it detached may still run")
        note(f"timed out after {timeout:g}s: {what} (exit 124)", style="yellow")
    return outcome.exit_code


def _memory_limit(session: Session) -> str:
    try:
        limit = session.sandbox.info().spec.limits.memory_bytes
    except SandboxError:
        return ""
    if limit is None:
        return " (the backend's default)"
    return f" of {limit / 2**20:.0f} MiB"


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so Python's own flush at exit does not complain about the pipe."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
