"""A command's output as the model gets it: the head and the tail of each stream, the cut said,
and the whole of it kept on the host for a later ``exec_output`` call.

A model's context is small and precious; a build log is not. Each stream keeps its first third and
its last two thirds of the budget (an error is usually at the end, what ran at the beginning), and
says how many bytes it cut in between. Output longer than the budget is also spooled to a private
file (0600, in a 0700 directory of this server, up to ``SPOOL_LIMIT`` bytes a stream), so the model
can page through all of it; the spools of the oldest commands are dropped past ``KEPT_OUTPUTS``.
Output within the budget never touches the disk (the common case costs nothing).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import OrderedDict

TYPE_CHECKING = False  # (typing.TYPE_CHECKING without importing typing: the server's start-up is measured)
if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path
    from typing import BinaryIO

SPOOL_LIMIT = 64 * 2**20  # bytes of one stream kept for exec_output
KEPT_OUTPUTS = 50  # commands whose full output is kept


class StreamCapture:
    """One stream (stdout or stderr): head, tail, total, and the spool."""

    def __init__(self, budget: int, spool: Callable[[], BinaryIO] | None) -> None:
        self._head_size = budget // 3
        self._tail_size = budget - self._head_size
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0
        self._lock = threading.Lock()
        self._open_spool = spool
        self._spool: BinaryIO | None = None
        self.spooled = 0

    def _spill(self) -> None:
        """(lock held) The output outgrew the budget: from now on it goes to the spool too, starting
        with what head and tail hold, which is all of it so far (nothing was cut yet)."""
        opener, self._open_spool = self._open_spool, None
        if opener is None:
            return
        try:
            self._spool = opener()
        except OSError:
            return  # no spool: the cut output is all there is (the result says the cut)
        self._spool.write(self._head + self._tail)
        self.spooled = len(self._head) + len(self._tail)

    def write(self, chunk: bytes) -> None:
        with self._lock:
            if self.total + len(chunk) > self._head_size + self._tail_size and self._spool is None:
                self._spill()
            self.total += len(chunk)
            if self._spool is not None and self.spooled < SPOOL_LIMIT:
                kept = chunk[: SPOOL_LIMIT - self.spooled]
                self._spool.write(kept)
                self.spooled += len(kept)
            room = self._head_size - len(self._head)
            if room > 0:
                self._head += chunk[:room]
                chunk = chunk[room:]
            if chunk:
                self._tail += chunk
                if len(self._tail) > self._tail_size:
                    del self._tail[: len(self._tail) - self._tail_size]

    @property
    def cut(self) -> int:
        return self.total - len(self._head) - len(self._tail)

    def last_line(self) -> str:
        with self._lock:
            data = bytes(self._tail or self._head)
        lines = data.decode("utf-8", "replace").rstrip().splitlines()
        return lines[-1][-200:] if lines else ""

    def text(self) -> str:
        with self._lock:
            head, tail, cut = bytes(self._head), bytes(self._tail), self.cut
        if cut <= 0:
            return (head + tail).decode("utf-8", "replace")
        return (head.decode("utf-8", "replace") + f"\n[... {cut} bytes cut here; exec_output has them ...]\n"
                + tail.decode("utf-8", "replace"))

    def close(self) -> None:
        with self._lock:
            if self._spool is not None:
                self._spool.close()


class Spools:
    """The server's directory of full outputs, by command id; removed when the server ends."""

    def __init__(self) -> None:
        self._root: Path | None = None
        self._kept: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def opener(self, exec_id: str, stream: str) -> Callable[[], BinaryIO]:
        """A function that opens the spool of ``exec_id``'s ``stream``, called only if it is needed."""

        def open_spool() -> BinaryIO:
            return open(self._path(exec_id, stream), "wb")

        return open_spool

    def kept(self, exec_id: str) -> bool:
        with self._lock:
            return exec_id in self._kept

    def _path(self, exec_id: str, stream: str) -> Path:
        with self._lock:
            if self._root is None:
                import tempfile
                from pathlib import Path

                self._root = Path(tempfile.mkdtemp(prefix="hermes-sandboxes-mcp-"))  # 0700
            self._kept[exec_id] = None
            while len(self._kept) > KEPT_OUTPUTS:
                old, _ = self._kept.popitem(last=False)
                for gone in ("stdout", "stderr"):
                    with contextlib.suppress(FileNotFoundError):
                        (self._root / f"{old}.{gone}").unlink()
            root = self._root
        return root / f"{exec_id}.{stream}"

    def read(self, exec_id: str, stream: str, offset: int, length: int) -> tuple[bytes, int] | None:
        """``length`` bytes of a command's ``stream`` from ``offset``, and the stream's spooled size."""
        with self._lock:
            root = self._root
            known = exec_id in self._kept
        if root is None or not known or stream not in ("stdout", "stderr"):
            return None
        path = root / f"{exec_id}.{stream}"
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                f.seek(offset)
                return f.read(length), size
        except FileNotFoundError:  # that stream was not cut: the exec result has all of it
            return b"", 0

    def close(self) -> None:
        with self._lock:
            root, self._root = self._root, None
        if root is not None:
            import shutil

            shutil.rmtree(root, ignore_errors=True)
