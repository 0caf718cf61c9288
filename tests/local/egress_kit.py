"""Loopback servers on the host for the egress tests: plain HTTP and HTTPS (self-signed), each
serving a directory and an ``/auth`` endpoint that says whether the expected secret arrived (never
echoing what it received, so the sandbox cannot learn the secret from the answer); and a site with
a pip simple index and a bare git repository, served by ``python3 -m http.server``.

They also play what an attacker would point a brokered secret at: ``/echo`` answers every request
header it got (an endpoint that reflects a header), and a request whose target is a URL is routed
to that URL's virtual host, as a front server that routes by the target does. Every request head a
server got is kept in ``Server.seen``."""

from __future__ import annotations

import datetime
import http.server
import ipaddress
import os
import re
import ssl
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

WHEEL = "hsbdemo-1.0-py3-none-any.whl"


def build_site(root: Path) -> Path:
    """A pip simple index with one wheel (hsbdemo 1.0) and a bare git repository (repo.git, one
    commit named "hello", ready for dumb HTTP)."""
    wheel = root / "files" / WHEEL
    wheel.parent.mkdir(parents=True)
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("hsbdemo/__init__.py", "VALUE = 42\n")
        z.writestr("hsbdemo-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: hsbdemo\nVersion: 1.0\n")
        z.writestr("hsbdemo-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr("hsbdemo-1.0.dist-info/RECORD", "")
    index = root / "simple" / "hsbdemo"
    index.mkdir(parents=True)
    (index / "index.html").write_text(f'<a href="../../files/{WHEEL}">{WHEEL}</a>\n')
    work = root / "work"
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    for args in (["init", "-q", str(work)], ["-C", str(work), "commit", "-q", "--allow-empty", "-m", "hello"],
                 ["clone", "-q", "--bare", str(work), str(root / "repo.git")],
                 ["-C", str(root / "repo.git"), "update-server-info"]):
        subprocess.run(["git", *args], check=True, env=env, capture_output=True)
    return root


@contextmanager
def http_server_process(directory: Path) -> Iterator[int]:
    """``python3 -m http.server`` serving ``directory`` on 127.0.0.1; yields its port."""
    proc = subprocess.Popen([sys.executable, "-u", "-m", "http.server", "--bind", "127.0.0.1",
                             "--directory", str(directory), "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        match = re.search(r"port (\d+)", proc.stdout.readline())
        assert match, "http.server did not say its port"
        yield int(match.group(1))
    finally:
        proc.kill()
        proc.wait()


@dataclass(frozen=True)
class Seen:
    method: str
    target: str
    headers: tuple[tuple[str, str], ...]


@dataclass
class Server:
    port: int
    scheme: str
    seen_auth: list[str] = field(default_factory=list)  # Authorization headers that arrived
    requests: list[str] = field(default_factory=list)  # paths asked for
    seen: list[Seen] = field(default_factory=list)  # every request head that arrived, any method
    tls_cert: str = ""  # the certificate an HTTPS server presents (what a client must trust)

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"


class _Handler(http.server.SimpleHTTPRequestHandler):
    server_record: Server
    expected: str

    def parse_request(self) -> bool:
        parsed = super().parse_request()
        if parsed:
            self.server_record.seen.append(Seen(self.command, self.path, tuple(self.headers.items())))
        return parsed

    def _answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.server_record.requests.append(self.path)
        auth = self.headers.get("Authorization", "")
        arrived = self.expected in auth or _basic_has(auth, self.expected)
        if "://" in self.path:  # another virtual host, named by the target
            self._answer(b"routed-elsewhere " + (b"secret-arrived\n" if arrived else b"no-secret\n"))
            return
        if self.path.startswith("/echo"):
            self._answer("".join(f"{k}: {v}\n" for k, v in self.headers.items()).encode())
            return
        if self.path.startswith("/auth"):
            self.server_record.seen_auth.append(auth)
            self._answer(b"secret-arrived\n" if arrived else b"no-secret\n")
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
    record = Server(0, "https" if tls else "http", tls_cert=str(tls[0]) if tls else "")
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
