"""A command's output as the model gets it: the head and the tail of each stream, the cut said,
and the whole of it kept on the host for a later ``exec_output`` call.

A model's context is small and precious; a build log is not. Each stream keeps its first third and
its last two thirds of the budget (an error is usually at the end, what ran at the beginning), and
says how many bytes it cut in between. Everything is also spooled to a private file (0600, in a
0700 directory of this server, up to ``SPOOL_LIMIT`` bytes a stream), so the model can page through
the full output; the spools of the oldest commands are dropped past ``KEPT_OUTPUTS``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

SPOOL_LIMIT = 64 * 2**20  # bytes of one stream kept for exec_output
KEPT_OUTPUTS = 50  # commands whose full output is kept


class StreamCapture:
    """One stream (stdout or stderr): head, tail, total, and the spool."""

    def __init__(self, budget: int, spool: Path | None) -> None:
        self._head_size = budget // 3
        self._tail_size = budget - self._head_size
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0
        self._lock = threading.Lock()
        self._spool = open(spool, "wb") if spool is not None else None  # noqa: SIM115 - closed by close()
        self.spooled = 0

    def write(self, chunk: bytes) -> None:
        with self._lock:
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

    def paths(self, exec_id: str) -> tuple[Path, Path]:
        with self._lock:
            if self._root is None:
                self._root = Path(tempfile.mkdtemp(prefix="hermes-sandboxes-mcp-"))  # 0700
            self._kept[exec_id] = None
            while len(self._kept) > KEPT_OUTPUTS:
                old, _ = self._kept.popitem(last=False)
                for stream in ("stdout", "stderr"):
                    with contextlib.suppress(FileNotFoundError):
                        (self._root / f"{old}.{stream}").unlink()
            root = self._root
        return root / f"{exec_id}.stdout", root / f"{exec_id}.stderr"

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
        except FileNotFoundError:
            return None

    def close(self) -> None:
        with self._lock:
            root, self._root = self._root, None
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)
