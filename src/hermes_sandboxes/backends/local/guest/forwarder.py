"""Inside a ``proxy`` sandbox: a TCP port on the sandbox's loopback that leads to the egress proxy.

The sandbox's network namespace has a loopback interface and nothing else: no other interface, no
route, no address through which a process could bypass the proxy. Tools expect an HTTP proxy at a
TCP address (``HTTP_PROXY=http://127.0.0.1:3128``), so the init forks this forwarder, which accepts
there and relays each connection, byte for byte, to the host-side proxy's unix socket at
``/dev/hermes-egress/proxy.sock`` (the host binds it there, in the sandbox's own /dev, through
/proc/<init>/root: no mount of a host directory, so no host path shows in the sandbox's
mountinfo). It decides nothing: every check happens on the host, so a process that kills it,
replaces the socket or talks to it directly gains nothing.

It is a child of the init, in the init's cgroups, so it stops with the sandbox. Standard library
only (it is forked from the init, which must stay cheap).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading

from hermes_sandboxes.backends.local.guest import syscalls as sc

PORT = 3128
INSIDE_DIR = "/dev/hermes-egress"
SOCKET_NAME = "proxy.sock"
_BUFFER = 256 * 1024


def _pump(src: socket.socket, dst: socket.socket) -> None:
    buf = bytearray(_BUFFER)
    view = memoryview(buf)
    try:
        while n := src.recv_into(buf):
            dst.sendall(view[:n])
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def _relay(conn: socket.socket, path: str) -> None:
    with conn:
        try:
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(path)
        except OSError:
            return  # the proxy is down: the client sees its connection closed
        with upstream:
            back = threading.Thread(target=_pump, args=(upstream, conn), daemon=True)
            back.start()
            _pump(conn, upstream)
            back.join()


def _serve(listener: socket.socket, path: str) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            continue
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_relay, args=(conn, path), daemon=True).start()


NAME = b"hermes-forward"  # what ps shows inside for the forwarder (its comm)


def start() -> int:
    """Bind the port (so it is there before any command runs), fork the forwarder, return its pid.
    The forwarder keeps no descriptor of the init's (control socket, cgroup files...)."""
    os.makedirs(INSIDE_DIR, mode=0o755, exist_ok=True)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", PORT))
    listener.listen(128)
    pid = os.fork()
    if pid == 0:
        try:
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
                signal.signal(sig, signal.SIG_DFL if sig != signal.SIGPIPE else signal.SIG_IGN)
            # its name in ps inside, as the stubs have theirs (tests tell them apart by it); a prctl:
            # /proc/self/comm of a non-dumpable process is host root's to write
            sc.set_name(NAME)
            keep = listener.fileno()
            os.closerange(3, keep)
            os.closerange(keep + 1, 1 << 16)
            _serve(listener, f"{INSIDE_DIR}/{SOCKET_NAME}")
        finally:
            os._exit(1)
    listener.close()
    return pid
