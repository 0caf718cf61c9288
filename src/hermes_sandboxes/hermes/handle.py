"""A streaming process handle for Hermes over the contract's ``Process``.

Hermes's ``_wait_for_process`` drains ``handle.stdout`` (a real file descriptor, read with select) while
it polls ``handle.poll()``; on its deadline or an interrupt it calls ``handle.kill()``. Hermes's
``_ThreadedProcessHandle`` would buffer the whole output until the command ends; here every chunk the
sandbox produces is written into a pipe as it arrives, so partial output survives a timeout and long
commands show progress.

``poll()`` reports an exit code only once every chunk is in the pipe and the pipe's write end is
closed, so the drain sees EOF instead of guessing from an idle pipe. The handle deliberately has no
``pid``: Hermes's backstop kills ``pid``'s tree on the host, and this command's tree lives in the
sandbox; ``kill()`` asks the sandbox to kill it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from typing import IO

from hermes_sandboxes.recorder.credentials import Redactor, StreamRedactor
from hermes_sandboxes.sandbox import Process

logger = logging.getLogger(__name__)

Starter = Callable[[Callable[[bytes], None]], Process]


class StreamingHandle:
    """Hermes ``ProcessHandle`` duck type: ``stdout``, ``poll``, ``wait``, ``kill``, ``returncode``."""

    def __init__(self, start: Starter, redactor: Redactor | None = None) -> None:
        read_fd, self._write_fd = os.pipe()
        self._stdout: IO[str] = os.fdopen(read_fd, "r", encoding="utf-8", errors="replace")
        self._write_lock = threading.Lock()
        self._done = threading.Event()
        self._returncode: int | None = None
        self._stream = StreamRedactor(redactor, self._write_raw) if redactor else None
        try:
            self._process = start(self._write)
        except BaseException:
            self._close_writer()
            self._stdout.close()
            raise
        threading.Thread(target=self._wait_for_exit, name="sandbox-exec-wait", daemon=True).start()

    # --- output path: sandbox reader threads -> (redactor) -> pipe -> Hermes's drain thread
    def _write(self, chunk: bytes) -> None:
        with self._write_lock:
            if self._stream is not None:
                self._stream.write(chunk)
            else:
                self._write_raw(chunk)

    def _write_raw(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                written = os.write(self._write_fd, view)
            except OSError:
                return  # reader gone (Hermes stopped draining): drop, never block the sandbox
            view = view[written:]

    def _close_writer(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._write_fd)

    def _wait_for_exit(self) -> None:
        code: int | None = None
        try:
            code = self._process.wait()
        except Exception:
            logger.warning("lost the connection to a sandboxed command", exc_info=True)
        finally:
            with self._write_lock:
                if self._stream is not None:
                    self._stream.flush()
                self._close_writer()
            self._returncode = 1 if code is None else code
            self._done.set()

    # --- ProcessHandle
    @property
    def stdout(self) -> IO[str]:
        return self._stdout

    @property
    def returncode(self) -> int | None:
        return self._returncode if self._done.is_set() else None

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        self._done.wait(timeout)
        return self.returncode

    def kill(self) -> None:
        """Kill the command's whole process tree inside the sandbox; the sandbox itself survives."""
        try:
            self._process.kill()
        except Exception:
            logger.warning("could not kill a sandboxed command", exc_info=True)
