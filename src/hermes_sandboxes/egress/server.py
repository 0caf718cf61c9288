"""The egress proxy as a process: ``python -m hermes_sandboxes.egress.server CONFIG``.

Started by the backend with the listening unix socket as an inherited descriptor (bound before the process
starts, so no connection is ever lost to a start-up race) and the brokered secrets as one JSON
object on stdin (never in argv, the environment or a file). CONFIG is a JSON file:

    {"sandbox": NAME, "policy": PATH, "audit": PATH, "ca_dir": PATH or null,
     "upstream_ca": PATH or null, "credentials": [{"name", "hosts", "placeholder"}, ...]}

The allow-list is read from the ``policy`` file ({"allow": [...]}) and read again whenever that
file changes, so a new list applies to the next connection without a restart. A policy file that
is missing or does not parse allows nothing (fail closed).
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import sys
import threading
from pathlib import Path
from typing import Any

from hermes_sandboxes.allowlist import AllowList
from hermes_sandboxes.egress.auditlimit import clip
from hermes_sandboxes.egress.broker import Broker
from hermes_sandboxes.egress.proxy import EgressProxy
from hermes_sandboxes.recorder.credentials import Redactor
from hermes_sandboxes.recorder.journal import Journal


class PolicyFile:
    """The allow-list in ``path``, re-read when the file is replaced or changed."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._key: tuple[int, int, int] | None = None
        self._current = AllowList([])

    def __call__(self) -> AllowList:
        try:
            st = os.stat(self._path)
            key = (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            return AllowList([])
        with self._lock:
            if key != self._key:
                self._current = self._load()
                self._key = key
            return self._current

    def _load(self) -> AllowList:
        try:
            data = json.loads(self._path.read_text())
            return AllowList([str(e) for e in data["allow"]])
        except Exception as exc:
            sys.stderr.write(f"hermes-sandboxes egress proxy: unusable policy {self._path} ({exc}); "
                             "allowing nothing\n")
            return AllowList([])


def build(config: dict[str, Any], secrets: dict[str, str]) -> EgressProxy:
    broker = Broker(config.get("credentials") or [], secrets)
    # the audit log gets its own redaction too: a secret must not reach it even by mistake
    redactor = Redactor(broker.secrets())
    audit = Journal(Path(config["audit"]), durable=False, redact=redactor.redact)
    authority = None
    if broker and config.get("ca_dir"):
        from hermes_sandboxes.egress.tls import Authority  # cryptography: loaded only when brokering

        authority = Authority(Path(config["ca_dir"]))
    upstream = ssl.create_default_context(cafile=config.get("upstream_ca") or None)
    return EgressProxy(str(config["sandbox"]), audit, PolicyFile(Path(config["policy"])),
                       broker=broker, authority=authority, upstream_tls=upstream)


def _one_line(args: threading.ExceptHookArgs) -> None:
    """What escapes a connection's thread: one clipped line in the log, never a traceback."""
    sys.stderr.write("hermes-sandboxes egress proxy: a connection thread failed: "
                     f"{clip(f'{args.exc_type.__name__}: {args.exc_value}', 300)}\n")


def main() -> None:
    """``CONFIG FD [INIT_FD]``: the configuration file, the inherited listening socket's descriptor
    and (the local backend) a pidfd of the sandbox's init: the proxy exits when that init is gone."""
    threading.excepthook = _one_line
    if len(sys.argv) > 3:
        threading.Thread(target=_exit_with, args=(int(sys.argv[3]),), daemon=True, name="init-watch").start()
    config = json.loads(Path(sys.argv[1]).read_text())
    secrets = json.loads(sys.stdin.read() or "{}")
    sys.stdin.close()
    listener = socket.socket(fileno=int(sys.argv[2]))
    build(config, {str(k): str(v) for k, v in secrets.items()}).serve(listener)


def _exit_with(pidfd: int) -> None:
    """Wait until the process behind ``pidfd`` has exited, then end this one."""
    import select

    select.select([pidfd], [], [])
    os._exit(0)


if __name__ == "__main__":
    main()
