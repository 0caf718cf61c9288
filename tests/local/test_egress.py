"""Network mode ``proxy``: an allow-list enforced by a host-side proxy, and brokered credentials.

Everything here is real: test servers on the host's loopback (plain HTTP, HTTPS with a self-signed
certificate the proxy is told to trust), curl, pip and git inside the sandbox, the proxy process
the backend starts. The audit log is read back to check what the proxy recorded.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermes_sandboxes.backends.local import LocalBackend, LocalSandbox
from hermes_sandboxes.egress.broker import BrokeredCredential
from hermes_sandboxes.errors import InvalidInput
from hermes_sandboxes.recorder.journal import EgressRecord, Journal
from hermes_sandboxes.recorder.state import HostState
from hermes_sandboxes.sandbox import SandboxSpec
from tests.cli.cli_kit import hs, ok
from tests.conftest import teardown_backend
from tests.local import egress_kit
from tests.local.kit import (
    ROOTLESS,
    fresh_name,
    init_state,
    new_sandbox,
    pid_alive,
    sh,
    temp_backend,
    temp_home,
    view_root,
    wait_for,
)

SECRET = "hsb-test-secret-" + os.urandom(8).hex()
SECRET_VAR = "HSB_EGRESS_TEST_TOKEN"  # the host variable the credential's value comes from


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return egress_kit.build_site(tmp_path_factory.mktemp("site"))


@pytest.fixture(scope="module")
def index_server(site: Path) -> Iterator[int]:
    """``python3 -m http.server`` serving the site (the simple index and the dumb-HTTP git repository)."""
    with egress_kit.http_server_process(site) as port:
        yield port


@pytest.fixture(scope="module")
def upstream_cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return egress_kit.self_signed(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def http_a(site: Path) -> Iterator[egress_kit.Server]:
    with egress_kit.serve(site, SECRET) as server:
        yield server


@pytest.fixture(scope="module")
def http_b(site: Path) -> Iterator[egress_kit.Server]:
    with egress_kit.serve(site, SECRET) as server:
        yield server


@pytest.fixture(scope="module")
def https_a(site: Path, upstream_cert: tuple[Path, Path]) -> Iterator[egress_kit.Server]:
    with egress_kit.serve(site, SECRET, tls=upstream_cert) as server:
        yield server


@pytest.fixture(scope="module")
def https_b(site: Path, upstream_cert: tuple[Path, Path]) -> Iterator[egress_kit.Server]:
    with egress_kit.serve(site, SECRET, tls=upstream_cert) as server:
        yield server


def audit(backend: LocalBackend, sb: LocalSandbox) -> list[EgressRecord]:
    return Journal(HostState().audit_path(backend.key)).records_of(EgressRecord, sandbox=sb.name)


def audited(backend: LocalBackend, sb: LocalSandbox, port: int, verdict: str) -> list[EgressRecord]:
    """The audit records of connections to ``port``, once one with ``verdict`` is there: a refusal is
    recorded before the client hears of it, an allowed connection when it closes (just after)."""
    wait_for(lambda: any(r.port == port and r.verdict == verdict for r in audit(backend, sb)),
             f"a {verdict} audit record for port {port}", timeout=10)
    return [r for r in audit(backend, sb) if r.port == port]


CURL = "curl -sS -f -m 10"


# allow-list ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def plain(local_backend: LocalBackend, http_a: egress_kit.Server, https_a: egress_kit.Server,
          upstream_cert: tuple[Path, Path]) -> Iterator[LocalSandbox]:
    """A proxy sandbox (no credentials: tunnels pass through) allowed to reach http_a and https_a."""
    spec = SandboxSpec(network="proxy", allow=(f"127.0.0.1:{http_a.port}", f"127.0.0.1:{https_a.port}"))
    with new_sandbox(local_backend, spec) as sb:
        sb.write_file("/root/upstream.pem", upstream_cert[0].read_bytes())
        yield sb


def test_an_allowed_http_server_answers_and_another_is_refused(
        local_backend: LocalBackend, plain: LocalSandbox, http_a: egress_kit.Server,
        http_b: egress_kit.Server) -> None:
    before_b = len(http_b.requests)
    assert sh(plain, f"{CURL} {http_a.url}/simple/hsbdemo/").stdout.startswith("<a href")
    refused = plain.exec(f"{CURL} {http_b.url}/simple/hsbdemo/")
    assert refused.exit_code == 22 and "403" in refused.stderr, refused.stderr
    assert len(http_b.requests) == before_b
    allowed = [r for r in audited(local_backend, plain, http_a.port, "allowed") if r.verdict == "allowed"]
    assert allowed[-1].bytes_in > 0 and allowed[-1].bytes_out > 0 and allowed[-1].reason == f"127.0.0.1:{http_a.port}"
    assert audit(local_backend, plain)[-1].port == http_b.port  # the refusal is logged before curl hears of it
    assert "simple" not in json.dumps([r.to_dict() for r in audit(local_backend, plain)])  # no paths, no payload


def test_the_cli_log_shows_what_the_proxy_let_through_and_refused(
        local_backend: LocalBackend, plain: LocalSandbox, http_a: egress_kit.Server,
        http_b: egress_kit.Server) -> None:
    sh(plain, f"{CURL} {http_a.url}/simple/hsbdemo/")
    plain.exec(f"{CURL} {http_b.url}/simple/hsbdemo/")
    audited(local_backend, plain, http_a.port, "allowed")
    shown = ok(local_backend.home, "log", plain.name).stdout
    assert f"allowed 127.0.0.1:{http_a.port}" in shown and f"refused 127.0.0.1:{http_b.port}" in shown, shown


def test_https_through_a_connect_tunnel_to_an_allowed_server_only(
        local_backend: LocalBackend, plain: LocalSandbox, https_a: egress_kit.Server,
        https_b: egress_kit.Server) -> None:
    ok = sh(plain, f"{CURL} --cacert /root/upstream.pem {https_a.url}/simple/hsbdemo/")
    assert ok.stdout.startswith("<a href")
    refused = plain.exec(f"{CURL} --cacert /root/upstream.pem {https_b.url}/simple/hsbdemo/")
    assert refused.exit_code != 0 and "403" in refused.stderr, refused.stderr
    assert not https_b.requests


def test_a_host_header_naming_another_host_is_refused(plain: LocalSandbox, http_a: egress_kit.Server) -> None:
    """No domain fronting: the server would route by Host, which must be the host that was checked."""
    before = len(http_a.requests)
    refused = plain.exec(f"{CURL} -H 'Host: elsewhere.example' {http_a.url}/simple/hsbdemo/")
    assert refused.exit_code == 22 and "403" in refused.stderr
    assert len(http_a.requests) == before


def test_request_bodies_reach_the_server_whole_however_they_are_framed(
        plain: LocalSandbox, http_a: egress_kit.Server) -> None:
    """Content-Length, chunked, and curl's Expect: 100-continue for a body over 1 MB."""
    sh(plain, "head -c 3000000 /dev/urandom > /root/body")
    expected = sh(plain, "sha256sum /root/body").stdout.split()[0]
    for extra in ("", "-H 'Transfer-Encoding: chunked'"):
        got = sh(plain, f"{CURL} {extra} --data-binary @/root/body {http_a.url}/post")
        assert got.stdout.strip() == expected, extra


def test_without_the_proxy_variables_nothing_is_reachable(plain: LocalSandbox, http_a: egress_kit.Server) -> None:
    before = len(http_a.requests)
    direct = plain.exec(f"env -u http_proxy -u HTTP_PROXY {CURL} {http_a.url}/simple/hsbdemo/; "
                        f"{CURL} --noproxy '*' {http_a.url}/simple/hsbdemo/; "
                        "python3 -c 'import socket; socket.create_connection((\"192.0.2.1\", 80), timeout=3)'")
    assert direct.exit_code != 0
    assert direct.stderr.count("Failed to connect") == 2, direct.stderr  # the sandbox's own lo: nothing
    assert "Network is unreachable" in direct.stderr  # no route off the sandbox's loopback
    assert len(http_a.requests) == before
    assert sh(plain, "ls /sys/class/net").stdout.split() == ["lo"]


def test_the_proxy_socket_is_there_without_a_host_path_in_the_mount_table(
        local_backend: LocalBackend, plain: LocalSandbox) -> None:
    assert sh(plain, "test -S /dev/hermes-egress/proxy.sock && echo socket").stdout == "socket\n"
    mounts = sh(plain, "cat /proc/self/mountinfo").stdout
    assert str(local_backend.home) not in mounts and "hermes-egress" not in mounts


@pytest.mark.skipif(ROOTLESS, reason="the rootless base has no pip (git over the proxy runs rootless too)")
def test_pip_downloads_from_a_local_index_through_the_proxy(local_backend: LocalBackend, index_server: int) -> None:
    spec = SandboxSpec(network="proxy", allow=(f"127.0.0.1:{index_server}",))
    with new_sandbox(local_backend, spec) as sb:
        result = sh(sb, f"python3 -m pip download --no-deps --disable-pip-version-check -d /root/dl "
                        f"--index-url http://127.0.0.1:{index_server}/simple/ --trusted-host 127.0.0.1 hsbdemo",
                    timeout=120)
        assert "hsbdemo-1.0-py3-none-any.whl" in sh(sb, "ls /root/dl").stdout, result.stdout


def test_git_clones_over_http_through_the_proxy(local_backend: LocalBackend, index_server: int) -> None:
    spec = SandboxSpec(network="proxy", allow=(f"127.0.0.1:{index_server}",))
    with new_sandbox(local_backend, spec) as sb:
        sh(sb, f"git clone -q http://127.0.0.1:{index_server}/repo.git /root/repo", timeout=120)
        assert sh(sb, "git -C /root/repo log --format=%s").stdout.strip() == "hello"


def test_a_changed_allow_list_applies_to_the_next_connection_without_restart(
        local_backend: LocalBackend, http_a: egress_kit.Server) -> None:
    with new_sandbox(local_backend, SandboxSpec(network="proxy")) as sb:
        assert sb.exec(f"{CURL} {http_a.url}/simple/hsbdemo/").exit_code == 22
        pid = init_state(sb)["pid"]
        sb.set_allow([f"127.0.0.1:{http_a.port}"])
        sh(sb, f"{CURL} {http_a.url}/simple/hsbdemo/")
        assert init_state(sb)["pid"] == pid
        assert local_backend.get(sb.name).spec.allow == (f"127.0.0.1:{http_a.port}",)  # kept for restarts


def test_a_name_that_resolves_to_loopback_is_refused_unless_loopback_is_allowed(
        local_backend: LocalBackend, http_a: egress_kit.Server) -> None:
    """DNS rebinding: allowing a name does not allow the private address it resolves to."""
    spec = SandboxSpec(network="proxy", allow=(f"localhost:{http_a.port}",))
    with new_sandbox(local_backend, spec) as sb:
        url = f"http://localhost:{http_a.port}/simple/hsbdemo/"
        via_proxy = f"env -u NO_PROXY -u no_proxy {CURL} {url}"  # localhost is no-proxy by default
        refused = sb.exec(via_proxy)
        assert refused.exit_code == 22 and "403" in refused.stderr
        record = audit(local_backend, sb)[-1]
        assert record.verdict == "refused" and "not public" in record.reason
        sb.set_allow([f"localhost:{http_a.port}", f"127.0.0.1:{http_a.port}"])
        sh(sb, via_proxy)


def test_a_proxy_that_died_is_started_again_by_the_next_command(
        plain: LocalSandbox, http_a: egress_kit.Server) -> None:
    proxy = init_state(plain)["egress"]
    os.kill(proxy["pid"], 9)
    os.waitpid(proxy["pid"], 0)
    sh(plain, f"{CURL} {http_a.url}/simple/hsbdemo/")
    assert init_state(plain)["egress"]["pid"] != proxy["pid"]


# (the init's stubs carry its command line too; their name tells them apart)
# by name: a stub the init just forked has the init's name until it renames itself, the forwarder its own
FORWARDERS = "ps -eo pid=,ppid=,comm= | awk '$2 == 1 && $3 == \"hermes-forward\" {print $1}'"


def test_a_forwarder_killed_from_inside_is_started_again(plain: LocalSandbox, http_a: egress_kit.Server) -> None:
    """An agent's ``pkill python3`` takes the forwarder (a child of the init) with it; the init
    starts another."""
    # exactly one (found by its name: a stub the init just forked is not one)
    wait_for(lambda: len(sh(plain, FORWARDERS).stdout.split()) == 1, "one forwarder", timeout=10)
    forwarders = sh(plain, FORWARDERS).stdout.split()
    assert len(forwarders) == 1, forwarders
    sh(plain, f"kill -9 {forwarders[0]}")
    wait_for(lambda: plain.exec(f"{CURL} {http_a.url}/simple/hsbdemo/").exit_code == 0,
             "the network to come back through a new forwarder", timeout=10)
    wait_for(lambda: len(sh(plain, FORWARDERS).stdout.split()) == 1, "one forwarder", timeout=10)
    again = sh(plain, FORWARDERS).stdout.split()
    assert len(again) == 1 and again != forwarders


def test_stopping_or_destroying_the_sandbox_kills_its_proxy(local_backend: LocalBackend) -> None:
    with new_sandbox(local_backend, SandboxSpec(network="proxy")) as sb:
        sh(sb, "true")
        pid = init_state(sb)["egress"]["pid"]
        sb.stop()
        assert not pid_alive(pid)
        sh(sb, "true")
        pid = init_state(sb)["egress"]["pid"]
    assert not pid_alive(pid)


def test_a_restored_proxy_sandbox_gets_a_new_proxy_and_keeps_its_list(
        local_backend: LocalBackend, http_a: egress_kit.Server) -> None:
    with new_sandbox(local_backend, SandboxSpec(network="proxy", allow=(f"127.0.0.1:{http_a.port}",))) as sb:
        sh(sb, f"{CURL} {http_a.url}/simple/hsbdemo/")
        checkpoint = sb.checkpoint()
        old = init_state(sb)["egress"]["pid"]
        sb.restore(checkpoint.id)
        assert not pid_alive(old)
        sh(sb, f"{CURL} {http_a.url}/simple/hsbdemo/")


def test_bad_allow_lists_are_refused_before_anything_starts(local_backend: LocalBackend) -> None:
    with pytest.raises(InvalidInput, match="preset"):
        local_backend.create("nope", SandboxSpec(network="proxy", allow=("@nosuch",)))
    with pytest.raises(InvalidInput, match="only applies"):
        local_backend.create("nope", SandboxSpec(network="host", allow=("pypi.org",)))
    assert "nope" not in local_backend.names()


# credential brokering ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def broker_backend(upstream_cert: tuple[Path, Path], http_a: egress_kit.Server,
                   https_a: egress_kit.Server) -> Iterator[LocalBackend]:
    os.environ[SECRET_VAR] = SECRET
    credential = BrokeredCredential(name="GITHUB_TOKEN", env=SECRET_VAR,
                                    hosts=(f"127.0.0.1:{http_a.port}", f"127.0.0.1:{https_a.port}"))
    try:
        with temp_backend(store="copy", credentials=[credential], upstream_ca=str(upstream_cert[0])) as backend:
            yield backend
    finally:
        os.environ.pop(SECRET_VAR, None)


@pytest.fixture(scope="module")
def brokered(broker_backend: LocalBackend, http_a: egress_kit.Server, http_b: egress_kit.Server,
             https_a: egress_kit.Server, https_b: egress_kit.Server) -> Iterator[LocalSandbox]:
    allow = tuple(f"127.0.0.1:{s.port}" for s in (http_a, http_b, https_a, https_b))
    with new_sandbox(broker_backend, SandboxSpec(network="proxy", allow=allow)) as sb:
        yield sb


def test_the_placeholder_becomes_the_secret_for_the_credential_s_hosts_only(
        broker_backend: LocalBackend, brokered: LocalSandbox, http_a: egress_kit.Server,
        https_a: egress_kit.Server, http_b: egress_kit.Server, https_b: egress_kit.Server) -> None:
    # the proxy's CA is trusted through SSL_CERT_FILE
    got = sh(brokered, f'{CURL} -H "Authorization: Bearer $GITHUB_TOKEN" {https_a.url}/auth')
    assert got.stdout == "secret-arrived\n"
    basic = sh(brokered, f'{CURL} -u "x-access-token:$GITHUB_TOKEN" {https_a.url}/auth')
    assert basic.stdout == "secret-arrived\n"
    before = len(http_a.seen_auth)
    cleartext = brokered.exec(f'{CURL} -u "x-access-token:$GITHUB_TOKEN" {http_a.url}/auth')
    assert cleartext.exit_code == 22 and "403" in cleartext.stderr  # the secret goes over TLS only
    assert len(http_a.seen_auth) == before
    for server in (http_b, https_b):
        before = len(server.seen_auth)
        refused = brokered.exec(f'{CURL} -H "Authorization: Bearer $GITHUB_TOKEN" {server.url}/auth')
        assert refused.exit_code == 22 and "403" in refused.stderr, (server.url, refused.stderr)
        assert len(server.seen_auth) == before
        assert sh(brokered, f"{CURL} {server.url}/auth").stdout == "no-secret\n"  # the host itself is allowed
    wait_for(lambda: any(r.port == https_a.port and r.credential == "GITHUB_TOKEN"
                         for r in audit(broker_backend, brokered)), "the credential's audit record")
    assert not any(r.credential for r in audit(broker_backend, brokered) if r.port in (http_b.port, https_b.port))


def test_an_intercepted_https_request_carries_its_body_whole(brokered: LocalSandbox,
                                                            https_a: egress_kit.Server) -> None:
    sh(brokered, "head -c 3000000 /dev/urandom > /root/body")
    expected = sh(brokered, "sha256sum /root/body").stdout.split()[0]
    got = sh(brokered, f"{CURL} -H 'Transfer-Encoding: chunked' --data-binary @/root/body {https_a.url}/post")
    assert got.stdout.strip() == expected


def test_the_secret_is_nowhere_in_the_sandbox_or_the_store(broker_backend: LocalBackend,
                                                          brokered: LocalSandbox,
                                                          https_a: egress_kit.Server) -> None:
    sh(brokered, f'{CURL} -H "Authorization: Bearer $GITHUB_TOKEN" {https_a.url}/auth -o /root/answer; '
                 'env > /root/env.txt')
    env = sh(brokered, "env").stdout
    assert "GITHUB_TOKEN=hsb-placeholder-github_token-" in env
    assert SECRET not in env and SECRET_VAR not in env
    assert sh(brokered, "grep -rlF \"$GITHUB_TOKEN\" /root").stdout.strip() == "/root/env.txt"
    processes = sh(brokered, "cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n'").stdout
    assert SECRET not in processes
    brokered.checkpoint("after using the credential")
    leaks = [str(p) for p in broker_backend.home.rglob("*")
             if p.is_file() and not p.is_symlink() and SECRET.encode() in p.read_bytes()]
    assert leaks == []  # store layers, checkpoints, run files, journals, the audit log
    assert audit(broker_backend, brokered)  # ...which does exist and was searched


def test_the_ca_key_stays_on_the_host(broker_backend: LocalBackend, brokered: LocalSandbox) -> None:
    assert (broker_backend.home / "egress-ca" / "ca.key").is_file()
    assert brokered.exec(f"ls {broker_backend.home}/egress-ca").stdout == ""
    assert "BEGIN CERTIFICATE" in sh(brokered, "cat $SSL_CERT_FILE").stdout
    assert "PRIVATE KEY" not in sh(brokered, "cat /dev/hermes-egress/*.pem").stdout


def test_a_credential_from_a_host_file_is_brokered_and_its_file_hidden(
        https_a: egress_kit.Server, upstream_cert: tuple[Path, Path]) -> None:
    # root mode: where the sandbox would see it unmasked; rootless, in the user's home, where it would be
    directory = Path(tempfile.mkdtemp(prefix="hsb-egress-cred-", dir=Path.home() if ROOTLESS else "/srv"))
    try:
        token_file = directory / "token"
        token_file.write_text(SECRET + "\n")
        credential = BrokeredCredential(name="API_TOKEN", file=str(token_file), hosts=(f"127.0.0.1:{https_a.port}",))
        with temp_backend(store="copy", credentials=[credential], upstream_ca=str(upstream_cert[0])) as backend, \
                new_sandbox(backend, SandboxSpec(network="proxy", allow=(f"127.0.0.1:{https_a.port}",))) as sb:
            hidden = sb.exec(f"cat {token_file}")
            assert hidden.exit_code != 0 and SECRET not in hidden.stdout
            got = sh(sb, f'{CURL} -H "Authorization: token $API_TOKEN" {https_a.url}/auth')
            assert got.stdout == "secret-arrived\n"
    finally:
        shutil.rmtree(directory)


def test_the_cli_creates_a_proxy_sandbox_with_allow_and_a_brokered_credential_from_its_config(
        tmp_path: Path, https_a: egress_kit.Server, https_b: egress_kit.Server,
        upstream_cert: tuple[Path, Path]) -> None:
    home = temp_home()
    config = tmp_path / "config.toml"
    config.write_text(f"""
[local]
home = "{home}"
upstream_ca = "{upstream_cert[0]}"
[local.brokered.API_TOKEN]
env = "{SECRET_VAR}"
hosts = ["127.0.0.1:{https_a.port}"]
""")
    name = fresh_name()
    env = {SECRET_VAR: SECRET}
    try:
        ok(home, "--config", str(config), "create", name, "--network", "proxy",
           "--allow", f"127.0.0.1:{https_a.port}", "--allow", f"127.0.0.1:{https_b.port}", env=env)
        auth = '-H "Authorization: Bearer $API_TOKEN"'
        got = ok(home, "--config", str(config), "exec", name, "--", f"{CURL} {auth} {https_a.url}/auth", env=env)
        assert got.stdout == "secret-arrived\n"
        refused = hs(home, "--config", str(config), "exec", name, "--", f"{CURL} {auth} {https_b.url}/auth", env=env)
        assert refused.exit_code == 22 and "403" in refused.stderr
    finally:
        teardown_backend(LocalBackend(home))


# the CA in the system trust store ------------------------------------------------------------------

# Every variable that names a CA bundle, unset: what is left is the system store.
NO_CA_ENV = "env -u SSL_CERT_FILE -u REQUESTS_CA_BUNDLE -u CURL_CA_BUNDLE -u GIT_SSL_CAINFO -u PIP_CERT " \
            "-u NODE_EXTRA_CA_CERTS -u SSL_CERT_DIR"
STORE_CRT = "/usr/local/share/ca-certificates/hermes-sandboxes-egress.crt"
SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


def _trusts_the_proxy_without_ca_variables(sb: LocalSandbox, server: egress_kit.Server) -> None:
    assert sh(sb, f"{NO_CA_ENV} {CURL} {server.url}/auth").stdout == "no-secret\n"
    if not ROOTLESS:  # the rootless base has no wget; curl and Python read the system store there too
        assert sh(sb, f"{NO_CA_ENV} wget -q -O - {server.url}/auth").stdout == "no-secret\n"
    fetch = f"import urllib.request; print(urllib.request.urlopen('{server.url}/auth', timeout=10).read().decode())"
    cleared = f"env -i HTTPS_PROXY=$HTTPS_PROXY python3 -c \"{fetch}\""  # nothing but the proxy
    assert sh(sb, cleared).stdout == "no-secret\n\n"


def test_the_proxy_ca_is_in_the_system_store_while_brokering_and_never_in_a_diff(
        broker_backend: LocalBackend, https_a: egress_kit.Server) -> None:
    spec = SandboxSpec(network="proxy", allow=(f"127.0.0.1:{https_a.port}",))
    with new_sandbox(broker_backend, spec) as sb:
        base = sb.checkpoint("fresh")
        _trusts_the_proxy_without_ca_variables(sb, https_a)
        ca_pem = (broker_backend.home / "egress-ca" / "ca.pem").read_text().strip()
        assert sh(sb, f"cat {STORE_CRT}").stdout.strip() == ca_pem
        assert sh(sb, "openssl verify -CApath /etc/ssl/certs -no-CAfile "
                      f"{STORE_CRT}").stdout.strip().endswith(": OK")  # the hashed link, for CApath readers
        assert sb.diff(base.id) == []  # the system store is not the agent's change
        sb.restore(base.id)
        _trusts_the_proxy_without_ca_variables(sb, https_a)
        # the agent rebuilds the store itself (what apt's upgrade of ca-certificates runs):
        # the CA stays, since its certificate is among the local ones
        sh(sb, "update-ca-certificates >/dev/null 2>&1", timeout=120)
        assert {c.path for c in sb.diff(base.id)} >= {SYSTEM_BUNDLE}
        _trusts_the_proxy_without_ca_variables(sb, https_a)
        sb.stop()
        # the same store, no longer brokering: the CA is gone, from the agent's own bundle too
        unbrokered = LocalBackend(broker_backend.home, store="copy")
        again = unbrokered.get(sb.name)
        assert again.exec(f"test -e {STORE_CRT}").exit_code == 1
        assert ca_pem not in sh(again, f"cat {SYSTEM_BUNDLE}").stdout
        assert "egress proxy CA" not in sh(again, "openssl crl2pkcs7 -nocrl -certfile "
                                                  f"{SYSTEM_BUNDLE} | openssl pkcs7 -print_certs -noout").stdout
        again.stop()


def test_without_brokering_the_system_store_is_the_base_s(plain: LocalSandbox) -> None:
    assert plain.exec(f"test -e {STORE_CRT}").exit_code == 1
    host_digest = hashlib.sha256((view_root() / SYSTEM_BUNDLE.lstrip("/")).read_bytes()).hexdigest()
    assert sh(plain, f"sha256sum < {SYSTEM_BUNDLE}").stdout.split()[0] == host_digest


def test_a_trust_store_the_sandbox_turned_into_a_symlink_is_not_followed_on_the_host(
        broker_backend: LocalBackend) -> None:
    """The host edits a bundle the agent wrote before the sandbox starts; a /etc/ssl/certs that the
    agent pointed at a host path (absolute, so the host would resolve it against its own root) is
    left alone, and so is the host file it names."""
    target = Path(tempfile.mkdtemp(prefix="hsb-trust-target-", dir="/tmp" if ROOTLESS else "/srv"))  # the user's
    try:
        (target / "ca-certificates.crt").write_text("host bundle\n")
        with new_sandbox(broker_backend, SandboxSpec(network="proxy")) as sb:
            sh(sb, f"rm -rf /etc/ssl/certs && mkdir -p {target} && echo inside > {target}/ca-certificates.crt "
                   f"&& ln -s {target} /etc/ssl/certs")
            sb.stop()
            assert sh(sb, "cat /etc/ssl/certs/ca-certificates.crt").stdout == "inside\n"  # started again
        assert (target / "ca-certificates.crt").read_text() == "host bundle\n"
    finally:
        shutil.rmtree(target)
