"""The host-side egress proxy of one sandbox: HTTP forwarding and CONNECT, checked per connection.

Each connection the sandbox opens (through its forwarder) gets a thread. The proxy reads one request
head: ``CONNECT host:port`` opens a tunnel, ``GET http://host/...`` (any method) forwards one
request. Either way the allow-list decides first (see policy.py) and the proxy connects to an
address it checked. Threads rather than asyncio: the work is bulk copying in large buffers, where a
blocking ``recv_into``/``sendall`` pair releases the GIL for the whole copy; benchmarks/bench_proxy.py
measures the same copy both ways in one run ("relay_design": threads 1.5-2x the throughput of
asyncio streams on the development machine), and a connection's thread costs far less than the
process start of the command that opened it. Splicing through a kernel pipe instead of
``recv_into``/``sendall`` was tried too and gave no consistent gain, so the simpler loop stays.

When the sandbox has brokered credentials, CONNECT tunnels are intercepted: the proxy answers TLS
with a certificate from the store's CA, reads the request head, swaps or refuses placeholders (see
broker.py) and talks TLS to the real server, verifying its certificate as any client would.
Without credentials a tunnel is passed through untouched.

Every connection, allowed or refused, leaves one record in the audit journal given to the proxy:
host, port, verdict, reason, byte counts and the name of a credential used; never a payload, a
path or a header.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from hermes_sandboxes.egress import relay
from hermes_sandboxes.egress.broker import Broker, Refused
from hermes_sandboxes.egress.http import (
    BadRequest,
    RequestHead,
    absolute_target,
    error_response,
    read_head,
    split_authority,
)
from hermes_sandboxes.egress.policy import AllowList, IPAddress
from hermes_sandboxes.recorder.journal import EgressRecord, Journal

if TYPE_CHECKING:
    from hermes_sandboxes.egress.tls import Authority

CONNECT_TIMEOUT_S = 10.0
HEAD_TIMEOUT_S = 30.0
# Threads run on the host, outside the sandbox's process limit: a sandbox opening connections
# without end must not exhaust the host, so connections past this many wait to be accepted.
MAX_CONNECTIONS = 256


class _Refusal(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason = status, reason
        self.answered = False  # already told the client (inside an intercepted TLS session)


class EgressProxy:
    def __init__(self, sandbox: str, audit: Journal, allow: Callable[[], AllowList], *,
                 broker: Broker | None = None, authority: Authority | None = None,
                 upstream_tls: ssl.SSLContext | None = None) -> None:
        self.sandbox = sandbox
        self.audit = audit
        self.allow = allow  # called per connection: a changed list applies to the next one
        self.broker = broker or Broker([], {})
        self.authority = authority
        self.upstream_tls = upstream_tls or ssl.create_default_context()
        if self.broker and authority is None:
            raise ValueError("brokered credentials need a certificate authority for HTTPS")

    def serve(self, listener: socket.socket) -> None:
        """Accept connections forever, each on its own thread, at most MAX_CONNECTIONS at once."""
        slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

        def run(conn: socket.socket) -> None:
            try:
                self.handle(conn)
            finally:
                slots.release()

        while True:
            slots.acquire()
            conn, _ = listener.accept()
            threading.Thread(target=run, args=(conn,), daemon=True).start()

    def handle(self, conn: socket.socket) -> None:
        tally = relay.Tally()
        try:
            conn.settimeout(HEAD_TIMEOUT_S)
            head, pending = read_head(conn)
            if head.method == "CONNECT":
                self._connect(conn, head, pending, tally)
            else:
                self._forward(conn, head, pending, tally)
        except _Refusal as refusal:
            tally.verdict, tally.reason = "refused", str(refusal)
            self._record(tally)  # before the answer: whoever saw the refusal finds it in the log
            if not refusal.answered:
                _send_quietly(conn, error_response(refusal.status, refusal.reason, str(refusal)))
        except BadRequest as exc:
            tally.reason = tally.reason or f"bad request: {exc}"
            _send_quietly(conn, error_response(400, "Bad Request", str(exc)))
        except (OSError, ssl.SSLError) as exc:
            tally.reason = tally.reason or f"{type(exc).__name__}: {exc}"
        finally:
            conn.close()
            self._record(tally)

    def _record(self, tally: relay.Tally) -> None:
        if not tally.host or tally.recorded:
            return  # nothing was asked for (a probe, or a client that hung up at once), or done
        tally.recorded = True
        try:
            self.audit.append(EgressRecord(
                sandbox=self.sandbox, host=tally.host, port=tally.port,
                verdict="allowed" if tally.verdict == "allowed" else "refused", reason=tally.reason,
                bytes_out=tally.bytes_out, bytes_in=tally.bytes_in, credential=tally.credential))
        except Exception as exc:  # the proxy serves on; its log says the audit is failing
            sys.stderr.write(f"hermes-sandboxes egress proxy: cannot write the audit log: {exc}\n")

    def _check(self, host: str, port: int, tally: relay.Tally) -> tuple[IPAddress, ...]:
        tally.host, tally.port = host.lower(), port
        verdict = self.allow().check(host, port)
        if not verdict.allowed:
            raise _Refusal(403, "Forbidden", f"refused {host}:{port}: {verdict.reason}")
        tally.verdict, tally.reason = "allowed", verdict.reason
        return verdict.addresses

    @staticmethod
    def _dial(addresses: tuple[IPAddress, ...], port: int) -> socket.socket:
        error: OSError | None = None
        for address in addresses:
            try:
                sock = socket.create_connection((str(address), port), timeout=CONNECT_TIMEOUT_S)
            except OSError as exc:
                error = exc
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        raise _Refusal(502, "Bad Gateway", f"cannot connect: {error}")

    def _broker(self, host: str, port: int, head: RequestHead, tally: relay.Tally) -> None:
        """Check the request's Host header, then swap or refuse its placeholders."""
        named = [v for k, v in head.headers if k.lower() == "host"]
        if len(named) > 1 or (named and _host_of(named[0]) != host.lower().strip("[]")):
            # the server would route by that header (a CDN serving many names): letting it differ from
            # the host checked would let a request reach, and a credential go to, a name not allowed
            tally.verdict = "refused"
            raise _Refusal(403, "Forbidden", f"refused {host}:{port}: the Host header names another host")
        try:
            tally.credential = self.broker.apply(host, port, head)
        except Refused as exc:
            tally.verdict = "refused"
            raise _Refusal(403, "Forbidden", f"refused {host}:{port}: {exc}") from None

    def _forward(self, conn: socket.socket, head: RequestHead, pending: bytes, tally: relay.Tally) -> None:
        host, port, path = absolute_target(head.target)
        addresses = self._check(host, port, tally)
        origin = head.for_origin(path)
        self._broker(host, port, origin, tally)
        upstream = self._dial(addresses, port)
        with upstream:
            relay.exchange(origin, pending, conn, upstream, tally)

    def _connect(self, conn: socket.socket, head: RequestHead, pending: bytes, tally: relay.Tally) -> None:
        host, port = split_authority(head.target, 443)
        addresses = self._check(host, port, tally)
        upstream = self._dial(addresses, port)
        with upstream:
            conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            if not self.broker:
                if pending:
                    upstream.sendall(pending)
                    tally.bytes_out += len(pending)
                relay.tunnel(conn, upstream, tally)
                return
            assert self.authority is not None
            client = self.authority.context_for(host.lower()).wrap_socket(conn, server_side=True)
            server = self.upstream_tls.wrap_socket(upstream, server_hostname=host)
            inner, rest = read_head(client)
            try:
                self._broker(host, port, inner, tally)
            except _Refusal as refusal:
                _send_quietly(client, error_response(refusal.status, refusal.reason, str(refusal)))
                refusal.answered = True
                raise
            relay.exchange(inner.for_origin(inner.target), rest, client, server, tally)


def _host_of(value: str) -> str:
    try:
        return split_authority(value.strip().lower(), 0)[0].strip("[]")
    except BadRequest:
        return ""


def _send_quietly(conn: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(data)
