"""Moving bytes between the sandbox's connection and the upstream one, counting them for the audit.

Two shapes:

- ``tunnel``: a CONNECT tunnel that is not intercepted carries a protocol the proxy does not read,
  so both directions run at once (one extra thread; plain sockets only).
- ``exchange``: one HTTP request and its response, in turn, on one thread. Used for plain HTTP and
  for intercepted TLS, where a single SSL object must never be read and written from two threads.
  The request body is framed by Content-Length or chunked encoding; the response runs until the
  server closes (the request went out with ``Connection: close``).
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from dataclasses import dataclass

from hermes_sandboxes.egress.http import BadRequest, RequestHead

BUFFER = 256 * 1024
IDLE_TIMEOUT_S = 600.0


@dataclass
class Tally:
    """What the audit log says about one connection."""

    host: str = ""
    port: int = 0
    verdict: str = "refused"
    reason: str = ""
    bytes_out: int = 0
    bytes_in: int = 0
    credential: str | None = None
    recorded: bool = False


def _close_both(a: socket.socket, b: socket.socket) -> None:
    for sock in (a, b):
        with contextlib.suppress(OSError):
            socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the raw socket, under any TLS layer


def _pump(src: socket.socket, dst: socket.socket, tally: Tally, outbound: bool) -> None:
    buf = bytearray(BUFFER)
    view = memoryview(buf)
    try:
        while n := src.recv_into(buf):
            dst.sendall(view[:n])
            if outbound:
                tally.bytes_out += n
            else:
                tally.bytes_in += n
        if outbound:
            dst.shutdown(socket.SHUT_WR)  # the sandbox is done sending: tell the server
    except OSError:
        _close_both(src, dst)


def tunnel(client: socket.socket, upstream: socket.socket, tally: Tally) -> None:
    """Relay both directions until the server is done, then drop the client's side too."""
    for sock in (client, upstream):
        sock.settimeout(IDLE_TIMEOUT_S)
    outbound = threading.Thread(target=_pump, args=(client, upstream, tally, True), daemon=True)
    outbound.start()
    _pump(upstream, client, tally, False)
    _close_both(client, upstream)
    outbound.join()


class _Reader:
    """Buffered reads from the client for body framing, starting with bytes already read."""

    def __init__(self, sock: socket.socket, pending: bytes) -> None:
        self.sock = sock
        self.pending = bytearray(pending)

    def fill(self) -> None:
        chunk = self.sock.recv(BUFFER)
        if not chunk:
            raise BadRequest("client closed the connection inside a request body")
        self.pending += chunk

    def take(self, limit: int) -> bytes:
        if not self.pending:
            self.fill()
        data = bytes(self.pending[:limit])
        del self.pending[:limit]
        return data

    def line(self) -> bytes:
        while (end := self.pending.find(b"\r\n")) < 0:
            if len(self.pending) > 8192:
                raise BadRequest("chunk header too long")
            self.fill()
        data = bytes(self.pending[:end + 2])
        del self.pending[:end + 2]
        return data


def _copy_exactly(reader: _Reader, dst: socket.socket, count: int, tally: Tally) -> None:
    while count > 0:
        data = reader.take(min(count, BUFFER))
        dst.sendall(data)
        tally.bytes_out += len(data)
        count -= len(data)


def _copy_chunked(reader: _Reader, dst: socket.socket, tally: Tally) -> None:
    while True:
        size_line = reader.line()
        dst.sendall(size_line)
        try:
            size = int(size_line.split(b";")[0].strip(), 16)
        except ValueError:
            raise BadRequest("bad chunk size") from None
        if size == 0:
            while (trailer := reader.line()) != b"\r\n":  # trailers, then the blank line
                dst.sendall(trailer)
            dst.sendall(b"\r\n")
            return
        _copy_exactly(reader, dst, size + 2, tally)  # the chunk and its CRLF


def send_body(head: RequestHead, pending: bytes, client: socket.socket, upstream: socket.socket,
              tally: Tally) -> None:
    """Pass the request body on, as long as its framing says (none when it has no framing)."""
    reader = _Reader(client, pending)
    encoding = ",".join(v for k, v in head.headers if k.lower() == "transfer-encoding").lower()
    lengths = {v.strip() for k, v in head.headers if k.lower() == "content-length"}
    if encoding:
        if encoding.replace(" ", "").split(",")[-1] != "chunked" or lengths:
            raise BadRequest("unsupported transfer encoding")  # also closes request smuggling
        _copy_chunked(reader, upstream, tally)
    elif lengths:
        if len(lengths) != 1 or not next(iter(lengths)).isdigit():
            raise BadRequest("bad Content-Length")
        _copy_exactly(reader, upstream, int(next(iter(lengths))), tally)


def exchange(head: RequestHead, pending: bytes, client: socket.socket, upstream: socket.socket,
             tally: Tally) -> None:
    """Send one request (``head`` already rewritten for the origin), then relay its response."""
    for sock in (client, upstream):
        sock.settimeout(IDLE_TIMEOUT_S)
    expects = any(k.lower() == "expect" and v.lower() == "100-continue" for k, v in head.headers)
    if expects:  # answered here, so the client sends its body without waiting for the server
        head.headers = [(k, v) for k, v in head.headers if k.lower() != "expect"]
        client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
    data = head.encode()
    upstream.sendall(data)
    tally.bytes_out += len(data)
    send_body(head, pending, client, upstream, tally)
    buf = bytearray(BUFFER)
    view = memoryview(buf)
    try:
        while n := upstream.recv_into(buf):
            client.sendall(view[:n])
            tally.bytes_in += n
    except ssl.SSLError:
        pass  # a server that closes without close_notify: the response is already through
