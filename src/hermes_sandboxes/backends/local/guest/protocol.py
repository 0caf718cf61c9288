"""Wire format between a host client and a sandbox's init: length-prefixed messages on a unix socket.

Messages are dicts of plain values serialised with ``marshal``: both ends run the same interpreter
(the init is started with the host's ``sys.executable``), the socket is reachable only by root on
the host, and marshal costs no import, where json (and the ``re`` it pulls in) would add a third to
the init's start-up time.

File descriptors (the command's stdin, stdout and stderr) travel with the first message as
SCM_RIGHTS, so output flows straight from the command into the client's pipes with no copy
through init.

Sockets are used through ``_socket``, the C core of the ``socket`` module: ``socket`` itself builds
four enums from the constants at import, a tenth of the start-up of a CLI exec (and of the init).
``socket.socket`` objects (the init's) are ``_socket.socket`` objects too.
"""

from __future__ import annotations

import _socket
import array
import marshal
import os
import struct

TYPE_CHECKING = False  # typing is not imported at run time: it slows the init's start
if TYPE_CHECKING:
    from typing import Any

VERSION = 4  # recorded with each running init: a client restarts an init that speaks another version
MAX_MESSAGE = 16 * 1024 * 1024
MAX_FDS = 4
_HEADER = struct.Struct("!I")
_FD = array.array("i")


class ProtocolError(Exception):
    pass


def send(sock: _socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    body = marshal.dumps(message)
    data = _HEADER.pack(len(body)) + body
    if fds:
        # (socket.send_fds, on the C core)
        sent = sock.sendmsg([data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, array.array("i", fds))])
        data = data[sent:]
    if data:
        sock.sendall(data)


def _recv_exact(sock: _socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise EOFError("connection closed")
        chunks += chunk
    return bytes(chunks)


def recv(sock: _socket.socket) -> tuple[dict[str, Any], list[int]]:
    """One message and the descriptors that came with it. EOFError when the peer closed."""
    # recvmsg, not socket.recv_fds: in Python 3.11 that ignores its flags, and the descriptors must
    # arrive close-on-exec or every command the init spawns inherits copies of them
    head, ancillary, _flags, _addr = sock.recvmsg(
        _HEADER.size, _socket.CMSG_LEN(MAX_FDS * _FD.itemsize), _socket.MSG_CMSG_CLOEXEC)
    fds = array.array("i")
    for level, kind, data in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % _FD.itemsize])
    if not head:
        for fd in fds:
            os.close(fd)
        raise EOFError("connection closed")
    if len(head) < _HEADER.size:
        head += _recv_exact(sock, _HEADER.size - len(head))
    (size,) = _HEADER.unpack(head)
    if size > MAX_MESSAGE:
        raise ProtocolError(f"message of {size} bytes is too large")
    try:
        message = marshal.loads(_recv_exact(sock, size))
    except (ValueError, EOFError, TypeError) as exc:
        raise ProtocolError(f"malformed message: {exc}") from exc
    if not isinstance(message, dict):
        raise ProtocolError("message is not an object")
    return message, list(fds)
