"""The exec WebSocket of the fake Sprites API, and the exec sessions behind it.

Wire format (what sprites-py 0.7.2 speaks): the first frame the server sends is a text frame
``{"type": "session_info", "session_id": ...}``. Without a TTY, binary frames start with a stream
byte (0 stdin, 1 stdout, 2 stderr, 3 exit followed by the exit code byte, 4 stdin end-of-file).
With ``tty=true`` binary frames are raw terminal bytes both ways, the client resizes with a text
frame ``{"type": "resize", "cols": c, "rows": r}`` and the exit comes as a text frame
``{"type": "exit", "exit_code": n}``. Like the real service, the server keeps the socket open for
a few seconds after the exit frame (a client must not wait for its close frame), and a command whose
client went away keeps running for a grace period (about 10 s there) unless it is killed through
``POST /v1/sprites/{name}/exec/{session}/kill``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import json
import os
import pty
import select
import struct
import termios
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from hermes_sandboxes.sandbox import Process
from tests.fakes.sprites.world import FakeSprite, iso

STDIN, STDOUT, STDERR, EXIT, STDIN_EOF = 0, 1, 2, 3, 4
_ids = itertools.count(1)
Send = Callable[[dict[str, Any]], Any]
Receive = Callable[[], Any]


@dataclass
class ExecSession:
    sprite: FakeSprite
    argv: list[str]
    cwd: str | None
    tty: bool
    id: str = field(default_factory=lambda: str(next(_ids)))
    created: float = field(default_factory=time.time)
    process: Process | None = None
    exit_code: int | None = None
    done: threading.Event = field(default_factory=threading.Event)
    killed_by_api: bool = False
    master_fd: int = -1
    client_closed_first: bool = False  # after the exit frame, the client hung up before the server did

    def to_json(self, *, command_list: bool = False) -> dict[str, Any]:
        command: Any = list(self.argv) if command_list else " ".join(self.argv)
        return {"id": self.id, ("cmd" if command_list else "command"): command, "workdir": self.cwd or "/",
                "created": iso(self.created), "bytes_per_second": 0, "is_active": not self.done.is_set(),
                "tty": self.tty, "last_activity": iso(time.time())}


@dataclass
class ExecRequest:
    argv: list[str]
    env: dict[str, str]
    cwd: str | None
    tty: bool
    rows: int
    cols: int
    stdin: bool

    @classmethod
    def parse(cls, query: list[tuple[str, str]]) -> ExecRequest:
        argv = [v for k, v in query if k == "cmd"]
        env = dict(v.split("=", 1) for k, v in query if k == "env" and "=" in v)
        one = {k: v for k, v in query}
        return cls(argv=argv, env=env, cwd=one.get("dir"), tty=one.get("tty") == "true",
                   rows=int(one.get("rows", "24")), cols=int(one.get("cols", "80")),
                   stdin=one.get("stdin", "true") == "true")


class Sessions:
    """Every exec session of one fake server, live and finished."""

    def __init__(self) -> None:
        self.all: dict[str, ExecSession] = {}

    def of(self, sprite: str) -> list[ExecSession]:
        return [s for s in self.all.values() if s.sprite.name == sprite and not s.done.is_set()]

    def kill(self, sprite: str, session_id: str, timeout: float, sig: str = "SIGTERM") -> bool:
        """Send ``sig`` to the session's command (its process group), and SIGKILL to its whole tree
        if it is still running ``timeout`` seconds later, as the service does: a command that
        ignores SIGTERM lives until then. True once it has ended."""
        session = self.all.get(session_id)
        if session is None or session.sprite.name != sprite:
            raise KeyError(session_id)
        session.killed_by_api = True
        process = session.process
        if process is None:
            return session.done.wait(timeout)
        pid = getattr(process, "pid", None)  # the command's pid inside the Sprite's sandbox
        sandbox = session.sprite.sandbox
        if sig == "SIGKILL" or not pid or sandbox is None:
            process.kill()
        else:  # from inside: the pid is the sandbox's; the command leads a process group of its own
            name = sig.removeprefix("SIG") if sig.removeprefix("SIG").isalpha() else "TERM"
            sandbox.exec(["kill", f"-{name}", "--", f"-{pid}"], timeout=30)
        if not session.done.wait(timeout):
            process.kill()
        return session.done.wait(timeout + 10)


class ExecConnection:
    """One exec WebSocket: starts the command, streams it, and detaches on a lost client."""

    def __init__(self, session: ExecSession, request: ExecRequest, send: Send, receive: Receive,
                 pool: Executor, *, grace: float, drop_after_output: bool, linger: float = 5.0) -> None:
        self.session = session
        self.request = request
        self._send = send
        self._receive = receive
        self._pool = pool
        self._grace = grace
        self._drop = drop_after_output
        self._queue: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue(maxsize=16)  # backpressure
        self._loop = asyncio.get_running_loop()
        self._linger = linger
        self._gone = asyncio.Event()  # the client closed its end
        self.detached = False
        self._exited = threading.Event()  # the terminal command ended: drain what it left, then stop
        self._drained = threading.Event()

    # output from the command's pump threads into the event loop, blocking when the client lags
    def _sink(self, stream: int) -> Callable[[bytes], None]:
        def write(chunk: bytes) -> None:
            if not self.detached:
                asyncio.run_coroutine_threadsafe(self._queue.put((stream, chunk)), self._loop).result()
        return write

    async def run(self) -> None:
        await self._send({"type": "websocket.accept"})
        await self._text({"type": "session_info", "session_id": self.session.id, "tty": self.request.tty,
                          "command": " ".join(self.request.argv), "is_owner": True})
        stdin = b"" if self.request.tty else await self._read_stdin()
        if stdin is None:  # the client left before the command started
            self.session.done.set()
            return
        try:
            await self._loop.run_in_executor(self._pool, self._start, stdin)
        except Exception as exc:
            await self._send({"type": "websocket.send", "bytes": bytes([STDERR]) + f"{exc}\n".encode()})
            await self._send({"type": "websocket.send", "bytes": bytes([EXIT, 127])})
            await self._send({"type": "websocket.close", "code": 1000})
            self.session.done.set()
            return
        reader = asyncio.ensure_future(self._read_client())
        try:
            await self._stream()
        finally:
            reader.cancel()

    async def _read_stdin(self) -> bytes | None:
        data = bytearray()
        if not self.request.stdin:
            return b""
        while True:
            message = await self._receive()
            if message["type"] == "websocket.disconnect":
                return None
            frame = message.get("bytes")
            if not frame:
                continue
            if frame[0] == STDIN:
                data += frame[1:]
            elif frame[0] == STDIN_EOF:
                return bytes(data)

    def _start(self, stdin: bytes) -> None:
        sandbox = self.session.sprite.sandbox
        assert sandbox is not None
        req, session = self.request, self.session
        if req.tty:
            master, slave = pty.openpty()
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", req.rows, req.cols, 0, 0))
            try:
                session.process = sandbox.attach(req.argv, (slave, slave, slave), cwd=req.cwd, env=req.env)
            finally:
                os.close(slave)
            session.master_fd = master
            threading.Thread(target=self._copy_terminal, daemon=True).start()
        else:
            session.process = sandbox.start(req.argv, cwd=req.cwd, env=req.env, stdin=stdin or None,
                                            on_stdout=self._sink(STDOUT), on_stderr=self._sink(STDERR))
        session.sprite.running += 1
        threading.Thread(target=self._wait_exit, daemon=True).start()

    def _copy_terminal(self) -> None:
        """Copy the terminal's output until the command has ended and all it wrote is read (as the
        service streams a command's output whole): a background job still holding the terminal
        does not keep the stream open, and nothing written before the end is dropped."""
        sink, fd = self._sink(STDOUT), self.session.master_fd
        try:
            while True:
                ready, _, _ = select.select([fd], [], [], 0 if self._exited.is_set() else 0.1)
                if not ready:
                    if self._exited.is_set():
                        return
                    continue
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # EIO: the last holder of the terminal's slave side is gone
                    return
                if not chunk:
                    return
                sink(chunk)
        finally:
            self._drained.set()

    def _wait_exit(self) -> None:
        session = self.session
        assert session.process is not None
        try:
            code = session.process.wait()
        except Exception:
            code = 255
        if session.master_fd >= 0:  # the terminal copier reads what is left, then stops
            self._exited.set()
            self._drained.wait()
            with contextlib.suppress(OSError):
                os.close(session.master_fd)
        session.exit_code = 255 if code is None else code
        session.sprite.running -= 1
        session.done.set()
        asyncio.run_coroutine_threadsafe(self._queue.put((EXIT, b"")), self._loop).result()

    async def _stream(self) -> None:
        tty = self.request.tty
        while True:
            stream, chunk = await self._queue.get()
            if self.detached:
                if stream == EXIT:
                    return
                continue
            if stream == EXIT:
                code = self.session.exit_code or 0
                if tty:
                    await self._text({"type": "exit", "exit_code": code})
                else:
                    await self._send({"type": "websocket.send", "bytes": bytes([EXIT, code & 0xFF])})
                # like the service: the socket stays open a while after the exit frame, so a client
                # that waits for the server's close frame waits that long
                try:
                    await asyncio.wait_for(self._gone.wait(), self._linger)
                    self.session.client_closed_first = True
                except TimeoutError:
                    await self._send({"type": "websocket.close", "code": 1000})
                return
            frame = chunk if tty else bytes([stream]) + chunk
            await self._send({"type": "websocket.send", "bytes": frame})
            if self._drop:  # fault: the connection dies mid-command, without an exit frame
                await self._send({"type": "websocket.close", "code": 1011, "reason": "injected drop"})
                self._detach()

    async def _read_client(self) -> None:
        while True:
            message = await self._receive()
            if message["type"] == "websocket.disconnect":
                self._gone.set()
                self._detach()
                return
            if not self.request.tty:
                continue  # stdin ended before the command started
            if message.get("bytes") and self.session.master_fd >= 0:
                with contextlib.suppress(OSError):
                    os.write(self.session.master_fd, message["bytes"])
            elif message.get("text"):
                data = json.loads(message["text"])
                if data.get("type") == "resize" and self.session.master_fd >= 0:
                    size = struct.pack("HHHH", int(data["rows"]), int(data["cols"]), 0, 0)
                    with contextlib.suppress(OSError):
                        fcntl.ioctl(self.session.master_fd, termios.TIOCSWINSZ, size)

    def _detach(self) -> None:
        """The client is gone: drop output, and kill the command after the grace period."""
        if self.detached:
            return
        self.detached = True  # _stream keeps draining the queue, so no pump thread stays blocked
        process = self.session.process
        if process is not None and not self.session.done.is_set():
            self._loop.call_later(self._grace, lambda: self._pool.submit(process.kill))

    async def _text(self, data: dict[str, Any]) -> None:
        await self._send({"type": "websocket.send", "text": json.dumps(data)})
