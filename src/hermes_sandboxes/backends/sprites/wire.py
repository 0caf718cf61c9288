"""One command over the Sprites exec WebSocket, streamed with bounded memory.

Why not the SDK's ``Sprite.command``: sprites-py 0.7.2 appends every output frame to an in-memory
buffer whatever the caller does with it (a command printing 1 GB holds 1 GB on the host), and it
does not expose the exec session id, which the kill endpoint needs. So this module speaks the same
protocol as the SDK's ``sprites.websocket`` (which we read; the fake server in tests/fakes/sprites
serves it) on the ``websockets`` library the SDK itself depends on:

- ``GET {api}/v1/sprites/{name}/exec?cmd=a&cmd=b&path=a&env=K=V&dir=/x&stdin=true`` upgraded to a
  WebSocket, ``Authorization: Bearer <token>``; an HTTP error status refuses the upgrade.
- Text frames are JSON: ``{"type": "session_info", "session_id": ...}`` first, later
  ``{"type": "exit", "exit_code": n}`` (with a TTY) and notifications we ignore.
- Without a TTY, binary frames carry a stream byte: 0 stdin, 1 stdout, 2 stderr, 3 exit (the next
  byte is the code), 4 stdin end-of-file. With ``tty=true&rows=&cols=`` they are raw terminal bytes.
- The client sends its stdin (0 + bytes) and then 4, or just 4.

Memory: frames are handed to the sinks as they arrive; the library's receive queue holds at most
``MAX_QUEUE`` frames of at most ``MAX_FRAME`` bytes, and reading pauses while it is full.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import BinaryIO
from urllib.parse import quote, urlencode

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.sync.client import ClientConnection, connect

STDIN, STDOUT, STDERR, EXIT, STDIN_EOF = 0, 1, 2, 3, 4
MAX_FRAME = 4 << 20
MAX_QUEUE = 8
STDIN_CHUNK = 64 << 10


class UpgradeRefused(Exception):
    """The server answered the upgrade with an HTTP error status."""

    def __init__(self, status: int, body: str, headers: Mapping[str, str]) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.body = body
        self.headers = dict(headers)


class Lost(Exception):
    """The connection failed or closed before the command's exit status arrived."""


@dataclass(frozen=True)
class ExecCall:
    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: str | None = None
    tty: bool = False
    rows: int = 24
    cols: int = 80

    def url(self, base_url: str, sprite: str) -> str:
        ws_base = "ws" + base_url[4:] if base_url.startswith("http") else base_url
        params: list[tuple[str, str]] = [("cmd", arg) for arg in self.argv]
        params.append(("path", self.argv[0]))
        params += [("env", f"{k}={v}") for k, v in self.env.items()]
        if self.cwd:
            params.append(("dir", self.cwd))
        if self.tty:
            params += [("tty", "true"), ("rows", str(self.rows)), ("cols", str(self.cols))]
        params.append(("stdin", "true"))
        return f"{ws_base}/v1/sprites/{quote(sprite, safe='')}/exec?{urlencode(params)}"


class ExecSocket:
    """An open exec connection: ``pump`` it to the end, or ``close`` it."""

    def __init__(self, base_url: str, token: str, sprite: str, call: ExecCall, *, open_timeout: float = 30.0,
                 user_agent: str = "hermes-sandboxes") -> None:
        self.call = call
        self.session_id: str | None = None
        self.on_session: Callable[[str], None] | None = None
        try:
            self._ws: ClientConnection = connect(
                call.url(base_url, sprite), additional_headers={"Authorization": f"Bearer {token}"},
                user_agent_header=user_agent, open_timeout=open_timeout, compression=None, proxy=None,
                ping_interval=15, ping_timeout=45, close_timeout=0, max_size=MAX_FRAME, max_queue=MAX_QUEUE)
        except InvalidStatus as exc:
            response = exc.response
            body = response.body.decode(errors="replace") if response.body else ""
            raise UpgradeRefused(response.status_code, body, dict(response.headers.raw_items())) from None
        except (InvalidHandshake, OSError, TimeoutError) as exc:
            raise Lost(f"could not open the exec connection: {type(exc).__name__}: {exc}") from None

    def send_stdin(self, data: bytes | None) -> None:
        """Send ``data`` and end-of-file (without a TTY), or ``data`` as typed input (with one)."""
        try:
            view = memoryview(data or b"")
            for start in range(0, len(view), STDIN_CHUNK):
                chunk = bytes(view[start:start + STDIN_CHUNK])
                self._ws.send(chunk if self.call.tty else bytes([STDIN]) + chunk)
            if not self.call.tty:
                self._ws.send(bytes([STDIN_EOF]))
        except (ConnectionClosed, OSError) as exc:
            raise Lost(f"the connection closed while sending stdin: {exc}") from None

    def send_stdin_stream(self, source: BinaryIO) -> None:
        """Pass ``source`` on chunk by chunk as it can be read, then end-of-file (the contract's rule
        for a stream: never read whole). Runs on a thread of its own, beside the output pump."""
        read = getattr(source, "read1", source.read)
        try:
            while chunk := read(STDIN_CHUNK):
                self._ws.send(chunk if self.call.tty else bytes([STDIN]) + chunk)
            if not self.call.tty:
                self._ws.send(bytes([STDIN_EOF]))
        except (ConnectionClosed, OSError, ValueError):
            pass  # the command ended (or the stream closed) first: the rest stays unread

    def send_raw(self, data: bytes) -> None:
        self._ws.send(data if self.call.tty else bytes([STDIN]) + data)

    def resize(self, rows: int, cols: int) -> None:
        self._ws.send(json.dumps({"type": "resize", "cols": cols, "rows": rows}))

    def pump(self, emit_stdout: Callable[[bytes], None], emit_stderr: Callable[[bytes], None]) -> int:
        """Deliver output until the exit status arrives; return it. Raises Lost otherwise."""
        try:
            for message in self._ws:
                if isinstance(message, str):
                    code = self._on_text(message)
                    if code is not None:
                        return code
                elif self.call.tty:
                    emit_stdout(message)
                elif message:
                    stream, payload = message[0], message[1:]
                    if stream == STDOUT:
                        emit_stdout(payload)
                    elif stream == STDERR:
                        emit_stderr(payload)
                    elif stream == EXIT:
                        return payload[0] if payload else 0
        except ConnectionClosed as exc:
            raise Lost(f"the connection closed before the command's exit status ({exc})") from None
        except OSError as exc:
            raise Lost(f"the connection failed before the command's exit status ({exc})") from None
        finally:
            self.close()
        raise Lost("the connection closed before the command's exit status")

    def _on_text(self, message: str) -> int | None:
        try:
            data = json.loads(message)
        except ValueError:
            return None
        if not isinstance(data, dict):
            return None
        if data.get("type") == "session_info" and data.get("session_id") is not None:
            self.session_id = str(data["session_id"])
            if self.on_session is not None:
                self.on_session(self.session_id)
        elif data.get("type") == "exit":
            return int(data.get("exit_code") or 0)
        return None

    def close(self) -> None:
        """Send a close frame without waiting for the answer: the service keeps an exec socket
        open for seconds after the exit frame (the SDK does the same, for the same reason)."""
        with contextlib.suppress(Exception):  # the result is already known; a late close changes nothing
            self._ws.close()
