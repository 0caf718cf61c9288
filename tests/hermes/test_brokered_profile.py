"""Brokered credentials through a real Hermes: the value the egress proxy adds comes from the active
Hermes profile (its secret scope, else its .env), never from whatever the host process happens to
hold, and a multiplexing gateway with no profile bound gets no value at all (fail closed)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from hermes_sandboxes.recorder.journal import EgressRecord, Journal
from hermes_sandboxes.recorder.state import HostState
from tests.local import egress_kit

if TYPE_CHECKING:
    from tests.hermes.conftest import HermesHarness

SECRET = "hsb-profile-secret-" + os.urandom(8).hex()
VAR = "HSB_PROFILE_BROKER_TOKEN"  # where the profile keeps the value
AUTH = 'curl -sS -m 10 -H "Authorization: Bearer $GITHUB_TOKEN"'


@pytest.fixture(scope="module")
def upstream_cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return egress_kit.self_signed(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, upstream_cert: tuple[Path, Path]) -> Iterator[egress_kit.Server]:
    """An HTTPS server (a brokered secret goes over TLS only), trusted by the proxy through upstream_ca."""
    with egress_kit.serve(tmp_path_factory.mktemp("site"), SECRET, tls=upstream_cert) as running:
        yield running


def _broker(hermes: HermesHarness, server: egress_kit.Server) -> None:
    entry = f"127.0.0.1:{server.port}"
    hermes.configure(network="proxy", allow=[entry], brokered={"GITHUB_TOKEN": {"env": VAR, "hosts": [entry]}},
                     upstream_ca=server.tls_cert)


def _nowhere_on_the_host(hermes: HermesHarness) -> None:
    """The secret is in no file of the sandbox (its layer, its run directory) nor of the host state
    (journals, audit log)."""
    (name,) = hermes.sandbox_names()
    backend = hermes.backend
    roots = [backend.store.layer(name), backend.layout.run_dir(name), HostState().root]
    leaks = [str(p) for root in roots for p in Path(root).rglob("*")
             if p.is_file() and not p.is_symlink() and SECRET.encode() in p.read_bytes()]
    assert leaks == []


def test_the_proxy_adds_the_profile_s_value_which_the_host_process_does_not_hold(
        hermes: HermesHarness, server: egress_kit.Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(VAR, raising=False)
    (hermes.home / ".env").write_text(f"{VAR}={SECRET}\n")
    _broker(hermes, server)
    sent = hermes.run(f"{AUTH} {server.url}/auth; echo; echo $GITHUB_TOKEN")
    answer, placeholder = sent["output"].split()
    assert answer == "secret-arrived" and placeholder.startswith("hsb-placeholder-github_token-"), sent
    assert SECRET not in json.dumps(sent)
    used = Journal(HostState().audit_path(hermes.backend.key)).records_of(EgressRecord)
    assert any(r.port == server.port and r.credential == "GITHUB_TOKEN" for r in used)
    _nowhere_on_the_host(hermes)


def test_a_multiplexing_gateway_uses_the_bound_profile_s_value_and_none_without_one(
        hermes: HermesHarness, server: egress_kit.Server, monkeypatch: pytest.MonkeyPatch) -> None:
    from agent import secret_scope

    monkeypatch.setenv(VAR, "another-profile-s-value-in-the-process")  # must never be the one sent
    _broker(hermes, server)
    multiplexed = secret_scope.set_multiplex_context(True)
    try:
        bound = secret_scope.set_secret_scope({VAR: SECRET}, profile_home=str(hermes.home))
        try:
            assert hermes.run(f"{AUTH} {server.url}/auth")["output"].strip() == "secret-arrived"
        finally:
            secret_scope.reset_secret_scope(bound)
        hermes.env().recorded.inner.stop()  # its proxy goes; the next command starts one, unscoped
        refused = hermes.run(f"{AUTH} -f {server.url}/auth")
        assert refused["exit_code"] == 22 and "403" in refused["output"], refused
    finally:
        secret_scope.reset_multiplex_context(multiplexed)
    assert not any("another-profile" in a for a in server.seen_auth)
    _nowhere_on_the_host(hermes)
