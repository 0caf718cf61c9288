"""The fork server: an interpreter with the init's modules loaded that forks one launcher per start.

launcher.py starts it once per host process, with one end of a SOCK_SEQPACKET socket pair as its
stdin. Each request is one packet carrying (SCM_RIGHTS) a stream socket of the requester's own. The
server forks; the child, the launcher, reads the configuration from that socket until end-of-file,
starts the init (init.launch) and answers on the same socket with the init's host pid or with what
went wrong, then exits. The server reads nothing else, holds nothing of any sandbox, and exits when
the requester's end of its stdin closes (the host process ended). A fork costs ~1 ms where a fresh
interpreter costs ~30 ms (far more on a busy machine).
"""

from __future__ import annotations

import marshal
import os
import signal
import socket

from hermes_sandboxes.backends.local import init

_SETUP_TIMEOUT_S = 60  # a launcher whose init never gets ready dies (SIGALRM) rather than hang on


def serve() -> None:
    # launchers are reaped by the kernel as they exit (each resets this for what it starts)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    control = socket.socket(fileno=0)
    while True:
        try:
            _message, fds, _flags, _addr = socket.recv_fds(control, 1, 4)
        except InterruptedError:  # pragma: no cover - retried by Python itself since 3.5
            continue
        if not _message:
            return  # the host process went away
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            continue
        if os.fork() == 0:
            _launcher(control, fds[0])
        os.close(fds[0])


def _launcher(control: socket.socket, fd: int) -> None:
    """The forked child: start one init as told on ``fd``, answer there, exit. Never returns."""
    answer = b"error: the launcher failed"
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.alarm(_SETUP_TIMEOUT_S)
        # stdin (the server's socket) becomes /dev/null rather than a free slot: a descriptor the
        # init opens must never land on 0, which it points at /dev/null
        devnull = os.open("/dev/null", os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        control.detach()
        with socket.socket(fileno=fd) as conn:
            try:
                cfg = marshal.loads(_read_all(conn))
                answer = f"{init.launch(cfg, close_in_init=(fd,))}\n".encode()
            except Exception as exc:
                answer = f"{exc}".encode() or type(exc).__name__.encode()
            conn.sendall(answer)
    finally:
        os._exit(0)


def _read_all(conn: socket.socket) -> bytes:
    chunks = []
    while chunk := conn.recv(1 << 16):
        chunks.append(chunk)
    if not chunks:
        raise EOFError("no configuration: the requester went away")
    return b"".join(chunks)
