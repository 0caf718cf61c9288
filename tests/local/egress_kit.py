"""Loopback servers on the host for the egress tests: plain HTTP and HTTPS (self-signed), each
serving a directory and an ``/auth`` endpoint that says whether the expected secret arrived (never
echoing what it received, so the sandbox cannot learn the secret from the answer)."""

from __future__ import annotations

import datetime
import http.server
import ipaddress
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass
class Server:
    port: int
    scheme: str
    seen_auth: list[str] = field(default_factory=list)  # Authorization headers that arrived
    requests: list[str] = field(default_factory=list)  # paths asked for

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"


class _Handler(http.server.SimpleHTTPRequestHandler):
    server_record: Server
    expected: str

    def do_GET(self) -> None:
        self.server_record.requests.append(self.path)
        if self.path.startswith("/auth"):
            auth = self.headers.get("Authorization", "")
            self.server_record.seen_auth.append(auth)
            body = b"secret-arrived\n" if self.expected in auth or _basic_has(auth, self.expected) else b"no-secret\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_GET()

    def do_POST(self) -> None:
        """Answers the SHA-256 of the body it received (framed by Content-Length or chunked)."""
        import hashlib

        digest = hashlib.sha256()
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while size := int(self.rfile.readline().split(b";")[0], 16):
                digest.update(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b""):
                pass
        else:
            digest.update(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        body = (digest.hexdigest() + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def _basic_has(auth: str, expected: str) -> bool:
    import base64
    import binascii

    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        return expected in base64.b64decode(token).decode()
    except (binascii.Error, UnicodeDecodeError):
        return False


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, and its key (the upstream the proxy must trust)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "egress test upstream")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                    x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "upstream.pem", directory / "upstream.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


@contextmanager
def serve(directory: Path, expected_secret: str, tls: tuple[Path, Path] | None = None) -> Iterator[Server]:
    record = Server(0, "https" if tls else "http")
    handler = type("Handler", (_Handler,), {"server_record": record, "expected": expected_secret})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(handler, directory=str(directory)))
    server.daemon_threads = True
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(tls[0]), str(tls[1]))
        server.socket = context.wrap_socket(server.socket, server_side=True)
    record.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield record
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
