"""The allow-list's grammar and decisions, and the broker's header rewriting (no network needed
beyond resolving ``localhost`` through the host's own resolver)."""

from __future__ import annotations

import base64
import ipaddress

import pytest

from hermes_sandboxes.allowlist import PRESETS, AllowList, is_public, parse_entry, validate
from hermes_sandboxes.egress.broker import Broker, BrokeredCredential
from hermes_sandboxes.egress.http import RequestHead
from hermes_sandboxes.errors import InvalidInput


def test_entries_parse_to_names_networks_and_ports() -> None:
    (rule,) = parse_entry("pypi.org")
    assert rule.name == "pypi.org" and rule.ports == {80, 443}
    (rule,) = parse_entry("*.PythonHosted.org:8443")
    assert rule.name == "*.pythonhosted.org" and rule.ports == {8443}
    (rule,) = parse_entry("10.0.0.0/8:*")
    assert rule.network == ipaddress.ip_network("10.0.0.0/8") and rule.allows_port(1)
    (rule,) = parse_entry("[::1]:9000")
    assert rule.network == ipaddress.ip_network("::1/128") and rule.ports == {9000}
    assert [r.name for r in parse_entry("@github")] == list(PRESETS["github"])


@pytest.mark.parametrize("bad", ["@nope", "exa mple.com", "pypi.org:0", "pypi.org:http", "[::1", "-x.com"])
def test_bad_entries_are_refused_by_name(bad: str) -> None:
    with pytest.raises(InvalidInput):
        validate([bad])


def test_a_wildcard_covers_subdomains_not_the_domain_itself() -> None:
    allow = AllowList(["*.example.com"])
    assert allow.rules[0].matches_name("a.b.example.com")
    assert not allow.rules[0].matches_name("example.com")
    assert not allow.rules[0].matches_name("badexample.com")


def test_ports_limit_what_an_entry_allows() -> None:
    allow = AllowList(["127.0.0.1:8080"])
    assert allow.check("127.0.0.1", 8080).allowed
    assert not allow.check("127.0.0.1", 8081).allowed
    assert not AllowList(["127.0.0.1"]).check("127.0.0.1", 8080).allowed  # default ports: 80, 443


def test_non_public_addresses_need_an_address_entry() -> None:
    for text in ("127.0.0.1", "10.1.2.3", "192.168.0.1", "169.254.169.254", "100.64.0.1", "::1", "fe80::1",
                 "::ffff:127.0.0.1", "0.0.0.0"):
        assert not is_public(ipaddress.ip_address(text)), text
    assert is_public(ipaddress.ip_address("93.184.216.34"))
    assert not AllowList(["*:*"]).check("169.254.169.254", 80).allowed  # metadata services included
    assert AllowList(["169.254.169.254:80"]).check("169.254.169.254", 80).allowed


def test_a_name_resolving_to_loopback_needs_loopback_allowed() -> None:
    verdict = AllowList(["localhost:8080"]).check("localhost", 8080)
    assert not verdict.allowed and "not public" in verdict.reason
    verdict = AllowList(["localhost:8080", "127.0.0.1:8080"]).check("localhost", 8080)
    assert verdict.allowed and ipaddress.ip_address("127.0.0.1") in verdict.addresses


def _broker() -> Broker:
    return Broker([{"name": "TOKEN", "hosts": ["api.example.com"], "placeholder": "PH-123"}], {"TOKEN": "s3cret"})


def test_the_broker_swaps_bearer_and_basic_placeholders_for_its_hosts_in_the_headers_it_names() -> None:
    basic = base64.b64encode(b"user:PH-123").decode()
    head = RequestHead("GET", "/", "HTTP/1.1", [("Authorization", "Bearer PH-123"), ("X-Other", f"Basic {basic}")])
    assert _broker().apply("api.example.com", 443, head, tls=True) == "TOKEN"
    assert head.headers[0] == ("Authorization", "Bearer s3cret")
    assert head.headers[1] == ("X-Other", f"Basic {basic}")  # not a header the credential names
    basic_auth = RequestHead("GET", "/", "HTTP/1.1", [("Authorization", f"Basic {basic}")])
    assert _broker().apply("api.example.com", 443, basic_auth, tls=True) == "TOKEN"
    assert base64.b64decode(basic_auth.headers[0][1].split()[1]) == b"user:s3cret"


def test_the_broker_refuses_a_placeholder_sent_anywhere_else_or_in_cleartext() -> None:
    from hermes_sandboxes.egress.broker import CredentialRefused

    with pytest.raises(CredentialRefused):
        _broker().apply("evil.example.net", 443, RequestHead("GET", "/", "HTTP/1.1", [("X-Token", "PH-123")]),
                        tls=True)
    with pytest.raises(CredentialRefused):
        _broker().apply("evil.example.net", 443, RequestHead("GET", "/?t=PH-123", "HTTP/1.1", []), tls=True)
    with pytest.raises(CredentialRefused, match="TLS"):
        _broker().apply("api.example.com", 80, RequestHead("GET", "/", "HTTP/1.1", [("Authorization", "PH-123")]),
                        tls=False)
    plain = RequestHead("GET", "/", "HTTP/1.1", [("Accept", "*/*")])
    assert _broker().apply("evil.example.net", 443, plain, tls=True) is None


def test_a_credential_needs_one_value_source_and_hosts() -> None:
    with pytest.raises(InvalidInput):
        BrokeredCredential(name="T", hosts=("a.com",))
    with pytest.raises(InvalidInput):
        BrokeredCredential(name="T", hosts=(), env="X")
    with pytest.raises(InvalidInput):
        BrokeredCredential(name="T", hosts=("a.com",), file="relative/path")


def test_settings_take_brokered_credentials_by_source_never_by_value() -> None:
    from hermes_sandboxes import backends
    from hermes_sandboxes.settings import InvalidSettings

    settings = backends.validate("local", {"network": "proxy", "allow": ["@pypi"], "brokered": {
        "GITHUB_TOKEN": {"hosts": ["github.com", "api.github.com"], "env": "GH_TOKEN"}}}, where="cfg")
    (credential,) = settings.brokered_credentials()  # type: ignore[attr-defined]
    assert credential == BrokeredCredential(name="GITHUB_TOKEN", hosts=("github.com", "api.github.com"),
                                            env="GH_TOKEN")
    for bad, why in (({"allow": ["@nope"]}, "preset"),
                     ({"brokered": {"T": {"hosts": ["a.com"], "value": "s3cret"}}}, "unknown setting"),
                     ({"brokered": {"T": {"hosts": ["a.com"]}}}, "exactly one value source"),
                     ({"brokered": {"T": {"hosts": ["a.com"], "file": "token.txt"}}}, "absolute")):
        with pytest.raises(InvalidSettings, match=why):
            backends.validate("local", bad, where="cfg")


def test_the_ca_goes_into_a_bundle_once_and_comes_out_however_often_it_was_added() -> None:
    from hermes_sandboxes.backends.local.trust import with_ca, without_ca

    ca = b"-----BEGIN CERTIFICATE-----\nQUJD\n-----END CERTIFICATE-----\n"
    other = b"-----BEGIN CERTIFICATE-----\nREVG\n-----END CERTIFICATE-----\n"
    added = with_ca(other, ca)
    assert added == other + ca and with_ca(added, ca) == added
    assert with_ca(b"", ca) == ca and with_ca(other.rstrip(b"\n"), ca) == other + ca
    assert without_ca(added + ca, ca) == other  # update-ca-certificates may have added it again
    assert without_ca(other, ca) == other


def test_an_edited_list_keeps_its_order_adds_once_and_refuses_to_remove_what_it_lacks() -> None:
    from hermes_sandboxes.allowlist import edited

    assert edited(["@pypi", "a.example"], add=[" A.example ", "b.example", "b.example"]) == [
        "@pypi", "a.example", "b.example"]
    assert edited(["@pypi", "a.example"], remove=["A.EXAMPLE"], add=["a.example:8080"]) == ["@pypi", "a.example:8080"]
    with pytest.raises(InvalidInput, match=r"no entry c\.example .*holds: @pypi"):
        edited(["@pypi"], remove=["c.example"])
