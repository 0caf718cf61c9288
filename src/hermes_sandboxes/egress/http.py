"""The little of HTTP/1.1 the egress proxy needs: read a request head, rewrite it, answer an error.

The proxy never parses a body. A forwarded request is sent with ``Connection: close``, so one
upstream connection carries exactly one request and its response is relayed as raw bytes until the
server closes it: no chunked decoding, no pipelining, nothing to get out of step.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass, field
from urllib.parse import urlsplit

MAX_HEAD = 64 * 1024
# Headers that belong to one hop (RFC 9110 section 7.6.1), never passed on.
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "proxy-authorization",
                         "proxy-authenticate", "te", "trailer", "upgrade"})
# Headers a front server (a CDN, a reverse proxy) may route by instead of Host: set by proxies, never
# by a client, and a way to name another virtual host than the one checked, so never passed on.
_ROUTING = frozenset({"forwarded", "x-forwarded-host", "x-forwarded-server", "x-host", "x-original-host",
                      "x-http-host-override", "x-original-url", "x-rewrite-url"})
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")  # a header name (RFC 9110 section 5.6.2)
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # CR, LF, NUL...: a second line a server may see


class BadRequest(Exception):
    """The client sent something that is not an HTTP/1.x request head we can forward."""


class OtherAuthority(BadRequest):
    """The request names another host (or port) than the one its connection was checked for."""


@dataclass
class RequestHead:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]] = field(default_factory=list)

    def encode(self) -> bytes:
        lines = [f"{self.method} {self.target} {self.version}"]
        lines += [f"{name}: {value}" for name, value in self.headers]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def for_origin(self, path: str) -> RequestHead:
        """This request as sent to the origin server: origin-form target, one request, no proxy headers."""
        headers = [(k, v) for k, v in self.headers if k.lower() not in _HOP_BY_HOP | _ROUTING]
        return RequestHead(self.method, path, self.version, [*headers, ("Connection", "close")])


def read_head(sock: socket.socket) -> tuple[RequestHead, bytes]:
    """A request head and whatever bytes followed it in the same reads (the start of its body)."""
    buf = b""
    while True:
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            break
        if len(buf) > MAX_HEAD:
            raise BadRequest("request head too long")
        chunk = sock.recv(65536)
        if not chunk:
            raise BadRequest("connection closed before a complete request head")
        buf += chunk
    text = buf[:end].decode("latin-1")
    request_line, *header_lines = text.split("\r\n")
    parts = request_line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or _CONTROL.search(request_line):
        raise BadRequest("not an HTTP/1.x request line")
    headers = []
    for line in header_lines:
        name, sep, value = line.partition(":")
        # a lone LF or CR would end the line for many servers: the rest a header nobody checked
        if not sep or not _TOKEN.match(name) or _CONTROL.search(value):
            raise BadRequest("malformed header line")
        headers.append((name, value.strip(" \t")))
    return RequestHead(parts[0], parts[1], parts[2], headers), buf[end + 4:]


def split_authority(authority: str, default_port: int) -> tuple[str, int]:
    """``host:port`` (IPv6 in brackets) as (host, port); BadRequest if the port is not a number."""
    if authority.startswith("["):
        host, _, rest = authority[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port_text = authority.rpartition(":") if ":" in authority else (authority, "", "")
    if not port_text:
        return host, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise BadRequest(f"bad port in {authority!r}")
    return host, int(port_text)


def absolute_target(target: str) -> tuple[str, int, str]:
    """(host, port, origin-form path) of a forward proxy's ``http://host[:port]/path`` target."""
    try:
        url = urlsplit(target)
    except ValueError:
        raise BadRequest("the request target is not a URL") from None
    if url.scheme != "http" or not url.netloc:
        raise BadRequest("only http:// URLs are forwarded; use CONNECT (https_proxy) for https")
    if "@" in url.netloc:
        raise BadRequest("credentials in the URL are not forwarded")
    host, port = split_authority(url.netloc, 80)
    path = (url.path or "/") + (f"?{url.query}" if url.query else "")
    return host, port, path


def request_path(target: str, host: str, port: int) -> str:
    """The origin-form path of a request on a connection to ``host:port`` (an intercepted tunnel):
    the target itself when it is a path (or ``*``), the path of an absolute target naming that very
    host and port. OtherAuthority for any other target (another host or port, userinfo, an
    authority-form target): the server might route by it, past the host that was checked."""
    if target.startswith("/") or target == "*":
        return target
    try:
        url = urlsplit(target)
        named, named_port = split_authority(url.netloc.lower(), 443 if url.scheme == "https" else 80)
    except (ValueError, BadRequest):
        raise OtherAuthority("the request target is neither a path nor a URL of this host") from None
    if (url.scheme not in ("http", "https") or "@" in url.netloc or named.strip("[]") != host.lower().strip("[]")
            or named_port != port):
        raise OtherAuthority(f"the request target names another host than {host}:{port}")
    return (url.path or "/") + (f"?{url.query}" if url.query else "")


def error_response(status: int, reason: str, message: str) -> bytes:
    body = f"hermes-sandboxes egress proxy: {message}\n".encode()
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode() + body
