"""Bounded output capture: keeps the head and the tail, drops the middle, whatever the size."""

from __future__ import annotations

from collections import deque


class BoundedCapture:
    """Holds at most ``limit`` bytes: the first half and the last half of everything written."""

    def __init__(self, limit: int = 256 * 1024) -> None:
        if limit < 2:
            raise ValueError("capture limit must be at least 2 bytes")
        self._head_limit = limit // 2
        self._tail_limit = limit - self._head_limit
        self._head = bytearray()
        self._tail: deque[bytes] = deque()
        self._tail_size = 0
        self.total = 0

    @property
    def truncated(self) -> bool:
        return self.total > len(self._head) + self._tail_size

    def write(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self._head_limit - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if not chunk:
            return
        if len(chunk) >= self._tail_limit:
            self._tail.clear()
            self._tail.append(chunk[-self._tail_limit :])
            self._tail_size = self._tail_limit
            return
        self._tail.append(chunk)
        self._tail_size += len(chunk)
        while self._tail_size > self._tail_limit:
            first = self._tail[0]
            excess = self._tail_size - self._tail_limit
            if len(first) <= excess:
                self._tail.popleft()
                self._tail_size -= len(first)
            else:
                self._tail[0] = first[excess:]
                self._tail_size -= excess

    def bytes(self) -> bytes:
        tail = b"".join(self._tail)
        if not self.truncated:
            return bytes(self._head) + tail
        dropped = self.total - len(self._head) - len(tail)
        return bytes(self._head) + f"\n[... {dropped} bytes omitted ...]\n".encode() + tail

    def text(self) -> str:
        return self.bytes().decode("utf-8", errors="replace")
