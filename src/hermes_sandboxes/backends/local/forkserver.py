"""The fork server: an interpreter with the init's modules loaded that forks one launcher per start.

launcher.py starts it once per host process, with one end of a SOCK_SEQPACKET socket pair as its
stdin. Each request is one packet carrying (SCM_RIGHTS) a stream socket of the requester's own. The
server forks; the child, the launcher, reads the first of two marshalled messages from that
socket: the groups to join, the network and what to hide (it joins them, makes the namespaces and
lists the other stores and loop images to hide at once: init.join_groups, init.make_namespaces,
masks.hidden_from_sandboxes), then forks the init (init.launch), says on the same socket the
init's host pid (``pid N``) or what went wrong (``error ...``), and exits; the init reads the
second message, the rest of the configuration, itself, and says ``ok`` there once it is ready.
A caller gets the launcher going before it knows the rest (a restore: while it stages the copy and
stops the old init). The server reads nothing else, holds nothing of any sandbox, and exits when the
requester's end of its stdin closes. That end is copied into every child the host process forks (a
warm server's workers, and whatever they fork), so it alone does not bind the server's life to its
owner's: an owner that started it from its main thread (the last of its threads to end) also has it
killed by the kernel when it dies (PR_SET_PDEATHSIG), however it ends (an idle exit, SIGTERM, kill -9).
A fork costs ~1 ms where a fresh interpreter costs ~30 ms (far more on a busy machine).
"""

from __future__ import annotations

import marshal
import os
import resource
import signal
import socket
from pathlib import Path

from hermes_sandboxes.backends.local import userns
from hermes_sandboxes.backends.local.guest import init, masks
from hermes_sandboxes.backends.local.guest import syscalls as sc

TYPE_CHECKING = False  # typing is not imported at run time (see init)
if TYPE_CHECKING:
    from typing import Any, BinaryIO

_SETUP_TIMEOUT_S = 60  # a launcher whose init never gets ready dies (SIGALRM) rather than hang on


def serve(owner: int | None = None) -> None:
    """Serve requests on stdin; ``owner``: the pid of the process whose death ends us (None: only
    the end of stdin does)."""
    if owner is not None:
        _die_with(owner)
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


def _die_with(owner: int) -> None:
    """SIGKILL when the thread that started us ends (the owner's main thread: its process's end);
    an owner already gone before that was set has left us to another parent, and we leave at once.
    (A fork clears the setting: the launchers and the inits are not bound to it.)"""
    sc.prctl(sc.PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != owner:
        os._exit(0)


def _launcher(control: socket.socket, fd: int) -> None:
    """The forked child: start one init as told on ``fd``, answer there, exit. Never returns."""
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.alarm(_SETUP_TIMEOUT_S)
        # stdin (the server's socket) becomes /dev/null rather than a free slot: a descriptor the
        # init opens must never land on 0, which it points at /dev/null
        devnull = os.open("/dev/null", os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        control.detach()
        with socket.socket(fileno=fd) as conn, conn.makefile("rb") as messages:
            try:
                first = _message(messages)
                if "umask" in first:  # the caller's, not this server's (the warm server's is 077)
                    os.umask(first["umask"])
                maker = _namespace_maker(first.get("userns"))  # made (or its forked child at work) while we join
                init.join_groups(first)
                ns_fd = _user_namespace(first.get("userns"), maker)
                init.make_namespaces(first)
                for resource_id, limit in first.get("rlimits", {}).items():
                    resource.setrlimit(resource_id, (limit, limit))
                hide = masks.hidden_from_sandboxes(Path(first["store_home"])) if first["lower"] == "/" else []
                if maker is not None:
                    maker.reap()  # a forked child, let go in take(), has exited meanwhile
                known = {"hide": hide, "masks": first.get("masks", ()), "userns": first.get("userns"),
                         "userns_fd": ns_fd}

                def configuration() -> dict[str, Any]:
                    """Read in the init (forked already): the fork cleared the launcher's alarm,
                    and an init whose configuration never comes must not wait for ever either."""
                    signal.alarm(_SETUP_TIMEOUT_S)
                    cfg = {**_message(messages), **known}
                    signal.alarm(0)
                    return cfg

                answer = f"pid {init.launch(configuration, fd)}\n".encode()
            except Exception as exc:
                answer = f"error {exc or type(exc).__name__}\n".encode()
            conn.sendall(answer)
    finally:
        os._exit(0)


def _namespace_maker(spec: dict[str, Any] | None) -> userns.ClonedMaker | userns.ForkedMaker | None:
    """Root mode: the sandbox's user namespace, started (see userns.namespace_maker); else None."""
    if not spec or spec["mode"] != "root":
        return None
    try:
        return userns.namespace_maker(_idmap(spec))
    except OSError as exc:  # no fork: the old way, said in the log
        spec["refused"] = str(exc)
        return None


def _user_namespace(spec: dict[str, Any] | None, maker: userns.ClonedMaker | userns.ForkedMaker | None,
                    ) -> int | None:
    """Root mode: a descriptor of the sandbox's user namespace (the init enters it once set up).
    Rootless: this launcher enters a new one now, so every namespace it makes next is owned by it."""
    if not spec:
        return None
    if spec["mode"] == "root":
        if maker is None:
            return None
        try:
            return maker.take()
        except OSError as exc:  # a chroot (the test guest's), a namespace limit: the old way, said in the log
            spec["refused"] = str(exc)
            return None
    userns.enter_new(_idmap(spec))
    return None


def _idmap(spec: dict[str, Any]) -> userns.IdMap:
    return userns.IdMap(tuple(tuple(line) for line in spec["uids"]), tuple(tuple(line) for line in spec["gids"]))


def _message(messages: BinaryIO) -> dict[str, Any]:
    try:
        message = marshal.load(messages)
    except EOFError:
        raise EOFError("no configuration: the requester went away") from None
    if not isinstance(message, dict):
        raise ValueError("malformed configuration")
    return message
