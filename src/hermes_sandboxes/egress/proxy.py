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

Every connection, allowed or refused, is recorded in the audit journal given to the proxy: host,
port, verdict, reason, byte counts and the name of a credential used; never a payload, a path or a
header. What comes from inside is clipped, and bursts of like records become one with a count
(auditlimit.py): a sandbox cannot fill the host's disk through its log.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from hermes_sandboxes.allowlist import AllowList, IPAddress, canonical_host
from hermes_sandboxes.egress import relay
from hermes_sandboxes.egress.auditlimit import AuditLimiter, LogBudget
from hermes_sandboxes.egress.broker import Broker, CredentialRefused
from hermes_sandboxes.egress.http import (
    BadRequest,
    OtherAuthority,
    RequestHead,
    absolute_target,
    error_response,
    read_head,
    request_path,
    split_authority,
)
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
        self.limiter = AuditLimiter(self._append)
        self.log = LogBudget()
        self.allow = allow  # called per connection: a changed list applies to the next one
        self.broker = broker or Broker([], {})
        self.authority = authority
        self.upstream_tls = upstream_tls or ssl.create_default_context()
        if self.broker and authority is None:
            raise ValueError("brokered credentials need a certificate authority for HTTPS")

    def serve(self, listener: socket.socket) -> None:
        """Accept connections forever, each on its own thread, at most MAX_CONNECTIONS at once."""
        slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        threading.Thread(target=self._ticks, daemon=True).start()

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
        except Exception as exc:  # input nothing above foresaw: one line in the log, never a traceback
            tally.reason = tally.reason or f"proxy error: {type(exc).__name__}"
            self.log.write(f"connection failed: {type(exc).__name__}: {exc}")
            _send_quietly(conn, error_response(400, "Bad Request", "the proxy could not handle this request"))
        finally:
            conn.close()
            self._record(tally)

    def _record(self, tally: relay.Tally) -> None:
        if not tally.host or tally.recorded:
            return  # nothing was asked for (a probe, or a client that hung up at once), or done
        tally.recorded = True
        self.limiter.submit(EgressRecord(
            sandbox=self.sandbox, host=tally.host, port=tally.port,
            verdict="allowed" if tally.verdict == "allowed" else "refused", reason=tally.reason,
            bytes_out=tally.bytes_out, bytes_in=tally.bytes_in, credential=tally.credential))

    def _append(self, record: EgressRecord) -> None:
        try:
            self.audit.append(record)
        except Exception as exc:  # the proxy serves on; its log says the audit is failing
            self.log.write(f"cannot write the audit log: {exc}")

    def _ticks(self) -> None:
        """Write aggregated records once their window ends, even when no connection comes."""
        while True:
            time.sleep(1.0)
            try:
                self.limiter.tick()
            except Exception as exc:
                self.log.write(f"audit aggregation failed: {type(exc).__name__}: {exc}")

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

    def _broker(self, host: str, port: int, head: RequestHead, tally: relay.Tally, *, tls: bool) -> None:
        """Check the request's Host header, then swap or refuse its placeholders."""
        named = [v for k, v in head.headers if k.lower() == "host"]
        if len(named) > 1 or (named and _authority_of(named[0], port) != (host.lower().strip("[]"), port)):
            # the server would route by that header (a CDN serving many names): letting it differ from
            # the host checked would let a request reach, and a credential go to, a name not allowed
            tally.verdict = "refused"
            raise _Refusal(403, "Forbidden", f"refused {host}:{port}: the Host header names another host")
        if not named:  # HTTP/1.0 or a hand-made request: the server gets the host that was checked
            head.headers.insert(0, ("Host", f"[{host}]:{port}" if ":" in host else f"{host}:{port}"))
        try:
            tally.credential = self.broker.apply(host, port, head, tls=tls)
        except CredentialRefused as exc:
            tally.verdict = "refused"
            raise _Refusal(403, "Forbidden", f"refused {host}:{port}: {exc}") from None

    def _inner(self, host: str, port: int, head: RequestHead, tally: relay.Tally) -> RequestHead:
        """A request read inside an intercepted tunnel, as sent on: origin-form, Host checked and
        placeholders swapped. A target that names any other authority is refused, not passed on:
        a server routing by the target would send the request, and its secret, to that host."""
        try:
            if head.method == "CONNECT":
                raise OtherAuthority("CONNECT inside a tunnel")
            origin = head.for_origin(request_path(head.target, host, port))
        except OtherAuthority as exc:
            tally.verdict = "refused"
            raise _Refusal(403, "Forbidden", f"refused {host}:{port}: {exc}") from None
        self._broker(host, port, origin, tally, tls=True)
        return origin

    def _forward(self, conn: socket.socket, head: RequestHead, pending: bytes, tally: relay.Tally) -> None:
        host, port, path = absolute_target(head.target)
        addresses = self._check(host, port, tally)
        origin = head.for_origin(path)
        self._broker(host, port, origin, tally, tls=False)
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
            name = canonical_host(host)
            # wrap_socket takes the descriptors over (conn and upstream are detached): the TLS
            # sockets must be closed here, or a refused client waits for an end that never comes
            client = self.authority.context_for(name).wrap_socket(conn, server_side=True)
            with client, self.upstream_tls.wrap_socket(upstream, server_hostname=name) as server:
                self._intercepted(host, port, client, server, tally)

    def _intercepted(self, host: str, port: int, client: ssl.SSLSocket, server: ssl.SSLSocket,
                     tally: relay.Tally) -> None:
        """One request inside an intercepted tunnel: checked, brokered, exchanged."""
        try:
            inner, rest = read_head(client)
        except BadRequest as exc:  # answered inside the tunnel, where the client listens
            _send_quietly(client, error_response(400, "Bad Request", str(exc)))
            refusal = _Refusal(400, "Bad Request", f"refused {host}:{port}: bad request: {exc}")
            refusal.answered = True
            raise refusal from None
        try:
            origin = self._inner(host, port, inner, tally)
        except _Refusal as refusal:
            _send_quietly(client, error_response(refusal.status, refusal.reason, str(refusal)))
            refusal.answered = True
            raise
        relay.exchange(origin, rest, client, server, tally)


def _authority_of(value: str, default_port: int) -> tuple[str, int] | None:
    """(host, port) a Host header names, its port defaulting to the connection's; None if unusable."""
    try:
        host, port = split_authority(value.strip().lower(), default_port)
    except BadRequest:
        return None
    return host.strip("[]"), port


def _send_quietly(conn: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(data)
