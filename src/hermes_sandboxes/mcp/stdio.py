"""The stdio transport: one client, newline-delimited JSON-RPC on stdin and stdout.

The protocol owns our stdin and stdout. Before anything else runs, both are moved to private
descriptors and descriptors 0 and 1 are pointed at /dev/null and stderr: a stray print, or a helper
process a backend starts and that inherits them, can neither corrupt the stream nor eat the
client's messages. The session ends when the client closes our stdin (or on SIGTERM, SIGHUP,
SIGINT): running commands are killed and recorded, the session's ephemeral sandboxes destroyed.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from hermes_sandboxes.mcp.server import Running

TYPE_CHECKING = False  # (typing.TYPE_CHECKING without importing typing: the server's start-up is measured)
if TYPE_CHECKING:
    from types import FrameType
    from typing import Any


class _Ended(Exception):
    """A signal asked the server to end."""


def _own_stdio() -> tuple[int, int]:
    """Our private copies of stdin and stdout; fds 0 and 1 now lead nowhere harmful."""
    sys.stdout.flush()
    read_fd, write_fd = os.dup(0), os.dup(1)
    os.set_inheritable(read_fd, False)
    os.set_inheritable(write_fd, False)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)  # a print() lands on stderr, which clients show as the server's log
    return read_fd, write_fd


def serve_stdio(running: Running) -> int:
    read_fd, write_fd = _own_stdio()

    def send(message: dict[str, Any]) -> None:
        data = (json.dumps(message, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        view = memoryview(data)
        while view:
            written = os.write(write_fd, view)
            view = view[written:]

    def ended(signum: int, frame: FrameType | None) -> None:
        raise _Ended(signal.Signals(signum).name)

    previous = {s: signal.signal(s, ended) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    session = running.open_session(send)
    reader = os.fdopen(read_fd, "rb")
    try:
        while True:
            line = reader.readline()
            if not line:
                break  # the client closed our stdin: its session is over
            if line.strip():
                session.receive_text(line)
    except _Ended:
        pass
    finally:
        for signum in previous:  # cleanup runs to its end (kill -9 leaves it to gc)
            signal.signal(signum, signal.SIG_IGN)
        running.close()
        reader.close()
    return 0
