"""Network mode ``proxy`` on the local backend: the host side of a sandbox's egress proxy.

Who runs the proxy: each ``proxy`` sandbox has its own proxy process, started with its init (just
before it) and stopped with it (``stop``, ``restore``, ``destroy``). A persistent sandbox outlives
the CLI call that started it, so the proxy must too: it runs in its own session, outside the
sandbox's cgroups (its memory is the host's, and freezing the sandbox for a checkpoint does not
freeze it), and its pid and start time sit in the init's record (init.json) next to the init's,
so whoever stops the sandbox later kills exactly that process. A proxy that died on its own is
started again by the next command, without restarting the sandbox.

Inside, /dev/hermes-egress/ (in the sandbox's own /dev tmpfs, made by the forwarder) holds the
proxy's socket and, when credentials are brokered, ca.pem and ca-bundle.pem. The host puts them
there right after the init starts, through /proc/<init pid>/root/dev, which is a mount point root
inside cannot move or replace; the last component is opened without following symlinks. The CA
also goes into the sandbox's system trust store, for tools that ignore the variables (trust.py).

Files under the sandbox's run directory on the host:

    egress-policy.json      the allow-list the proxy reads per connection (set_allow rewrites it)
    egress-config.json      the proxy's configuration (no secret in it)
    egress-state.json       the placeholders commands see, stable for the sandbox's life
    egress.log              the proxy's stderr

The secrets themselves reach the proxy on its stdin and live only in its memory.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hermes_sandboxes.backends.local import paths
from hermes_sandboxes.backends.local.guest import forwarder, protocol
from hermes_sandboxes.egress.broker import BrokeredCredential, SecretLookup, new_placeholder
from hermes_sandboxes.errors import SandboxError
from hermes_sandboxes.util import isolated

# what the proxy imports from outside the standard library (cryptography and its cffi backend: TLS)
_PROXY_PACKAGES = ("cryptography", "_cffi_backend")
_SYSTEM_BUNDLE = "etc/ssl/certs/ca-certificates.crt"
PROXY_URL = f"http://127.0.0.1:{forwarder.PORT}"
# What commands get in proxy mode. ``localhost`` is the sandbox's own loopback and bypasses the
# proxy; an address such as 127.0.0.1 goes through it and means the host's (refused unless allowed).
PROXY_ENV = {
    **{name: PROXY_URL for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")},
    **{name: "localhost" for name in ("NO_PROXY", "no_proxy")},
}
CA_ENV_NAMES = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "PIP_CERT")


class EgressFiles:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.policy = run_dir / "egress-policy.json"
        self.config = run_dir / "egress-config.json"
        self.state = run_dir / "egress-state.json"
        self.log = run_dir / "egress.log"

    def write_policy(self, allow: Sequence[str]) -> None:
        paths.write_json(self.policy, {"allow": list(allow)}, durable=False)

    def placeholders(self, credentials: Sequence[BrokeredCredential]) -> dict[str, str]:
        """The placeholder of each credential, made once and kept for the sandbox's life."""
        state = paths.read_json(self.state)
        known = dict(state.get("placeholders") or {}) if isinstance(state, dict) else {}
        wanted = {c.name: known.get(c.name) or new_placeholder(c.name) for c in credentials}
        if wanted != known:
            paths.write_json(self.state, {"placeholders": {**known, **wanted}}, durable=False)
        return wanted


def command_env(run_dir: Path, credentials: Sequence[BrokeredCredential]) -> dict[str, str]:
    """Variables every command of a proxy sandbox gets: the proxy, and with brokered credentials
    their placeholders and the CA bundle that makes the proxy's certificates trusted."""
    env = dict(PROXY_ENV)
    if credentials:
        inside = forwarder.INSIDE_DIR
        env.update({name: f"{inside}/ca-bundle.pem" for name in CA_ENV_NAMES})
        env["NODE_EXTRA_CA_CERTS"] = f"{inside}/ca.pem"
        env.update(EgressFiles(run_dir).placeholders(credentials))
    return env


def _inside_dir(init_pid: int, via_init: str | None = None) -> int:
    """An O_PATH descriptor of /dev/hermes-egress inside the sandbox of that init. ``via_init``:
    rootless, where the init's /proc entry is out of a user's reach (the init is not dumpable; its
    memory was made in the host's user namespace, where the user has no CAP_SYS_PTRACE), the init,
    at that control socket, sends the descriptor itself (guest/init.py's ``egress_dir``)."""
    if via_init is not None:
        from hermes_sandboxes.backends.local import client

        with client.connect(via_init) as sock:
            protocol.send(sock, {"op": "egress_dir"})
            reply, fds = protocol.recv(sock)
        if not reply.get("ok") or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise OSError(errno.ENOENT, str(reply.get("error") or "no directory in the init's reply"))
        return fds[0]
    dev = os.open(f"/proc/{init_pid}/root/dev", os.O_PATH | os.O_DIRECTORY)
    try:
        name = forwarder.INSIDE_DIR.removeprefix("/dev/")
        return os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dev)
    finally:
        os.close(dev)


def _write_inside(dir_fd: int, name: str, data: bytes) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=dir_fd)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _install_trust(dir_fd: int, ca_dir: Path, lower: str) -> None:
    from hermes_sandboxes.egress import tls  # cryptography: only when a proxy starts, never per exec

    ca_pem = tls.ensure_ca(ca_dir)
    try:
        system = (Path(lower) / _SYSTEM_BUNDLE).read_bytes()
    except OSError:
        system = b""
    _write_inside(dir_fd, "ca.pem", ca_pem)
    _write_inside(dir_fd, "ca-bundle.pem", system.rstrip(b"\n") + b"\n" + ca_pem)


def start_proxy(*, sandbox: str, init_pid: int, run_dir: Path, allow: Sequence[str], audit: Path, ca_dir: Path,
                lower: str, credentials: Sequence[BrokeredCredential], upstream_ca: str | None,
                lookup: SecretLookup | None = None, via_init: str | None = None) -> dict[str, Any]:
    """Start the proxy of the sandbox whose init runs as ``init_pid``; returns its record
    ({"pid", "start"}) for init.json. ``via_init``: see _inside_dir."""
    files = EgressFiles(run_dir)
    files.write_policy(allow)
    try:
        dir_fd = _inside_dir(init_pid, via_init)
    except OSError as exc:
        raise SandboxError(f"sandbox {sandbox}: cannot reach {forwarder.INSIDE_DIR} inside ({exc.strerror}; "
                           "removed or replaced from inside?); stop the sandbox and run a command to start "
                           "it afresh") from exc
    try:
        if credentials:
            _install_trust(dir_fd, ca_dir, lower)
        listener = _bind(dir_fd, forwarder.SOCKET_NAME)
    finally:
        os.close(dir_fd)
    placeholders = files.placeholders(credentials)
    config = {"sandbox": sandbox, "policy": str(files.policy), "audit": str(audit),
              "ca_dir": str(ca_dir) if credentials else None, "upstream_ca": upstream_ca,
              "credentials": [{"name": c.name, "hosts": list(c.hosts), "placeholder": placeholders[c.name],
                               "headers": list(c.headers)} for c in credentials]}
    paths.write_json(files.config, config, durable=False)
    secrets = {c.name: value for c in credentials if (value := c.load(lookup))}
    # the init's pidfd: the proxy ends with the incarnation it serves, also when the init stops
    # itself (idle_timeout) with no host process of ours left to stop the proxy
    init_fd = os.pidfd_open(init_pid)
    argv = isolated.python_argv("from hermes_sandboxes.egress.server import main; main()", str(files.config),
                                str(listener.fileno()), str(init_fd), packages=_PROXY_PACKAGES)
    with listener, open(files.log, "ab") as log:
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=log, stderr=log, pass_fds=(listener.fileno(), init_fd),
                cwd=isolated.CWD, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"},
                start_new_session=True)
        finally:
            os.close(init_fd)
    assert proc.stdin is not None
    try:
        proc.stdin.write(json.dumps(secrets).encode())
        proc.stdin.close()
    except OSError as exc:
        proc.kill()
        raise SandboxError(f"sandbox {sandbox}: the egress proxy did not start (see {files.log})") from exc
    return {"pid": proc.pid, "start": paths.process_start_time(proc.pid)}


def _bind(dir_fd: int, name: str) -> socket.socket:
    """A listening unix socket ``name`` in that directory (an old one, from a proxy that died, is
    replaced). Root inside connects; the checks are the proxy's, not the socket's mode. It belongs
    to whoever owns the directory (root inside, made it), whose host ids are not host root's in a
    user namespace of the sandbox's own."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(f"/proc/self/fd/{dir_fd}/{name}")
    owner = os.stat(dir_fd)
    os.chown(name, owner.st_uid, owner.st_gid, dir_fd=dir_fd, follow_symlinks=False)
    listener.listen(128)
    return listener


def alive(record: Mapping[str, Any] | None) -> bool:
    if not record:
        return False
    pid = int(record.get("pid", 0))
    return pid > 0 and paths.process_start_time(pid) == record.get("start")


def stop_proxy(record: Mapping[str, Any] | None) -> None:
    """Kill the proxy of that record (only that very process: pid and start time must match)."""
    if record and alive(record):
        pid = int(record["pid"])
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)  # our child when this process started it: leave no zombie
        except (ProcessLookupError, ChildProcessError):
            pass
