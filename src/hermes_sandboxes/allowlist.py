"""The egress allow-list: which (host, port) a sandbox's proxy lets through, and to which addresses.

Part of the contract (``SandboxSpec.allow``, ``Sandbox.set_allow``, the settings' ``allow``): the
core, the recorder and every backend parse the same entries, so the grammar lives here, with no
dependency but the errors; the proxy that enforces it is ``egress``.

Entries (the same text in the Python API, the CLI's ``--allow`` and the settings):

- ``pypi.org`` a host name; ``*.pythonhosted.org`` any name under that domain (not the domain
  itself); ``*`` any name at all (public addresses only, see below);
- ``203.0.113.7``, ``198.51.100.0/24``, ``::1``, ``[2001:db8::1]:443`` addresses and networks;
- any of these with ``:PORT`` or ``:*`` (every port); without a port an entry allows 80 and 443;
- ``@pypi``, ``@npm``, ``@debian``, ``@github``: the hosts those services download from.

Names are resolved on the host, and the proxy connects to the address it checked (never resolving
twice, so a name cannot change between the check and the connection). An address that is not
public (loopback, private, link-local, carrier-grade NAT, multicast, reserved...) is refused unless
an address entry names it: allowing ``intranet.example`` does not reach 10.0.0.5, and a public name
re-pointed at 127.0.0.1 (DNS rebinding) reaches nothing unless 127.0.0.1 is itself allowed.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from hermes_sandboxes.errors import InvalidInput

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
DEFAULT_PORTS = frozenset({80, 443})
ANY_PORT: frozenset[int] = frozenset()  # the empty set stands for "every port"

# What the common package indexes download from. Kept short: a preset is a promise about what an
# agent can reach, so it names the download hosts, not every mirror of the project.
PRESETS: dict[str, tuple[str, ...]] = {
    "pypi": ("pypi.org", "files.pythonhosted.org"),
    "npm": ("registry.npmjs.org", "registry.yarnpkg.com"),
    "debian": ("deb.debian.org", "security.debian.org"),
    "github": ("github.com", "api.github.com", "codeload.github.com", "*.githubusercontent.com"),
}

_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")
# Special-purpose ranges Python's ipaddress does not count as private but that are not the public
# internet either (shared address space of carrier-grade NAT).
_NOT_PUBLIC = (ipaddress.ip_network("100.64.0.0/10"),)


@dataclass(frozen=True)
class Rule:
    """One parsed entry: a name pattern or an address network, and its ports."""

    text: str
    ports: frozenset[int]  # ANY_PORT: every port
    name: str | None = None  # "pypi.org", "*.example.com" or "*"
    network: IPNetwork | None = None

    def allows_port(self, port: int) -> bool:
        return not self.ports or port in self.ports

    def matches_name(self, host: str) -> bool:
        if self.name is None:
            return False
        if self.name == "*":
            return True
        if self.name.startswith("*."):
            return host.endswith(self.name[1:])
        return host == self.name


def is_public(address: IPAddress) -> bool:
    """Whether ``address`` is on the public internet (what name entries may reach)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return is_public(address.ipv4_mapped)
    if any(address in net for net in _NOT_PUBLIC if net.version == address.version):
        return False
    return address.is_global and not address.is_multicast


def normalise_host(host: str) -> str:
    """Lower case, no trailing dot, brackets off an IPv6 literal; InvalidInput if not a host name."""
    text = host.strip().lower().rstrip(".")
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    if _address(text) is not None:
        return text
    labels = text.split(".")
    if not text or len(text) > 253 or not all(_LABEL.match(label) for label in labels):
        raise InvalidInput(f"not a host name: {host!r}")
    return text


def canonical_host(host: str) -> str:
    """One spelling per host, never failing: lower case, no brackets or trailing dots, an address in
    its canonical form (an IPv4-mapped IPv6 address as the IPv4 one). What per-host caches key on."""
    name = host.strip().strip("[]").lower().rstrip(".")
    address = _address(name)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return name if address is None else str(address)


def _address(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _parse_ports(text: str, entry: str) -> frozenset[int]:
    if text == "*":
        return ANY_PORT
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise InvalidInput(f"allow entry {entry!r}: port must be 1-65535 or *, got {text!r}")
    return frozenset({int(text)})


def _split_port(entry: str) -> tuple[str, frozenset[int]]:
    """``host[:port]`` with IPv6 in brackets when it has a port (a bare ``::1`` has none)."""
    if entry.startswith("["):
        inner, sep, rest = entry[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise InvalidInput(f"allow entry {entry!r}: write an IPv6 address with a port as [ADDRESS]:PORT")
        return inner, _parse_ports(rest[1:], entry) if rest else DEFAULT_PORTS
    if entry.count(":") == 1:
        host, port = entry.split(":")
        return host, _parse_ports(port, entry)
    return entry, DEFAULT_PORTS


def parse_entry(entry: str) -> list[Rule]:
    """The rules one allow-list entry stands for (a preset stands for several)."""
    text = entry.strip()
    if text.startswith("@"):
        hosts = PRESETS.get(text[1:].lower())
        if hosts is None:
            raise InvalidInput(f"unknown allow-list preset {text!r}; presets: "
                               + ", ".join(f"@{name}" for name in sorted(PRESETS)))
        return [rule for host in hosts for rule in parse_entry(host)]
    host, ports = _split_port(text)
    try:
        network = ipaddress.ip_network(host.lower(), strict=False)
    except ValueError:
        network = None
    if network is not None:
        return [Rule(text=text, ports=ports, network=network)]
    if host == "*":
        return [Rule(text=text, ports=ports, name="*")]
    wildcard = host.startswith("*.")
    try:
        name = normalise_host(host[2:] if wildcard else host)
    except InvalidInput:
        raise InvalidInput(f"allow entry {entry!r} is not a host name, *.domain, address or @preset") from None
    return [Rule(text=text, ports=ports, name=f"*.{name}" if wildcard else name)]


def validate(entries: Iterable[str]) -> tuple[str, ...]:
    """The entries as given, after checking that each one parses (InvalidInput names the bad one)."""
    out = tuple(str(e).strip() for e in entries)
    for entry in out:
        parse_entry(entry)
    return out


def edited(current: Sequence[str], *, add: Iterable[str] = (), remove: Iterable[str] = ()) -> list[str]:
    """``current`` without the ``remove`` entries and with the ``add`` ones appended, entries
    compared without case or surrounding spaces (one it holds already is kept once). Removing an
    entry it does not hold is InvalidInput, naming what it holds: a typo must not pass as done."""
    def key(entry: str) -> str:
        return entry.strip().lower()

    held = {key(e) for e in current}
    dropped = {key(e) for e in remove}
    missing = sorted(dropped - held)
    if missing:
        raise InvalidInput(f"the allow-list has no entry {', '.join(missing)} (it holds: "
                           f"{' '.join(current) or 'nothing'}); nothing was changed")
    kept = [e for e in current if key(e) not in dropped]
    kept_keys = {key(e) for e in kept}
    return kept + [e for e in dict.fromkeys(a.strip() for a in add) if key(e) not in kept_keys]


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    reason: str  # why refused, or which entry allowed it
    addresses: tuple[IPAddress, ...] = ()  # where the proxy may connect, in resolver order


class AllowList:
    """A parsed allow-list. Immutable: the proxy swaps in a new one when the list changes."""

    def __init__(self, entries: Sequence[str]) -> None:
        self.entries = tuple(entries)
        self.rules = [rule for entry in self.entries for rule in parse_entry(entry)]

    def _address_rule(self, address: IPAddress, port: int) -> Rule | None:
        for rule in self.rules:
            if rule.network is not None and rule.allows_port(port) and address in rule.network:
                return rule
        return None

    def check(self, host: str, port: int) -> Verdict:
        """Whether to connect to ``host:port``, and to which addresses; resolves names on the host."""
        try:
            name = normalise_host(host)
        except InvalidInput:
            return Verdict(False, "not a valid host name")
        literal = _address(name)
        if literal is not None:
            rule = self._address_rule(literal, port)
            if rule is None and is_public(literal):
                rule = next((r for r in self.rules if r.name == "*" and r.allows_port(port)), None)
            if rule is None:
                return Verdict(False, "no allow-list entry names this address and port")
            return Verdict(True, rule.text, (literal,))
        rule = next((r for r in self.rules if r.matches_name(name) and r.allows_port(port)), None)
        if rule is None:
            return Verdict(False, "no allow-list entry names this host and port")
        try:
            infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            return Verdict(False, f"cannot resolve: {exc.strerror}")
        found: list[IPAddress] = []
        for info in infos:
            address = ipaddress.ip_address(str(info[4][0]).split("%")[0])
            if address not in found:
                found.append(address)
        usable = tuple(a for a in found if is_public(a) or self._address_rule(a, port) is not None)
        if not usable:
            shown = ", ".join(str(a) for a in found)
            return Verdict(False, f"resolves only to addresses that are not public ({shown}) "
                                  "and that no address entry allows")
        return Verdict(True, rule.text, usable)
