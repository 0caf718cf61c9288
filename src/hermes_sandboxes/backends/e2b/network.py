"""The portable egress allow-list (network "proxy", see allowlist.py) as E2B's own egress rules.

E2B filters a sandbox's outbound traffic itself. ``allow_out`` lists destinations (IPv4 addresses
and networks, host names, ``*.domain`` for every name below a domain, not the domain itself: the
same meaning as ours), ``deny_out`` lists IPv4 networks, and an allowed destination wins over a
denied one. An allow-list therefore becomes ``deny_out: [0.0.0.0/0]`` plus one ``allow_out`` entry
per destination, presets expanded. What E2B cannot say is refused or, for ports, said out loud:

* ports: E2B allows a destination on every port, so an entry's port (or the 80 and 443 an entry
  without one means elsewhere) is not enforced: a documented degradation, which a warning repeats
  once per process;
* ``*`` (any name, public addresses only) has no E2B form (``0.0.0.0/0`` would take in private
  networks too): refused;
* IPv6 addresses and networks: refused (E2B's rules are IPv4).

Two differences stay, and docs/e2b.md names them: E2B matches a name as the sandbox's traffic
names it rather than by the host resolving it and refusing non-public addresses, and E2B keeps no
per-connection audit log on this host. The DNS server E2B allows beside a named destination
(8.8.8.8 by default) stays reachable.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hermes_sandboxes import allowlist as policy
from hermes_sandboxes.errors import SandboxError, Unsupported
from hermes_sandboxes.sandbox import NetworkMode, SandboxSpec

log = logging.getLogger(__name__)

ALL_IPV4 = "0.0.0.0/0"
_warned = threading.Event()


def _destination(rule: policy.Rule, entry: str) -> str:
    if rule.network is not None:
        if rule.network.version != 4:
            raise Unsupported(f"allow entry {entry!r}: E2B's egress rules take IPv4 addresses and networks only")
        return str(rule.network) if rule.network.prefixlen < 32 else str(rule.network.network_address)
    assert rule.name is not None
    if rule.name == "*":
        raise Unsupported(f"allow entry {entry!r}: E2B has no rule for every public name (0.0.0.0/0 would "
                          "allow private networks too); list the hosts or *.domains instead")
    return rule.name


def egress_rules(allow: Sequence[str]) -> dict[str, Any]:
    """E2B's ``network`` option for the allow-list ``allow`` (InvalidInput for a bad entry,
    Unsupported for one E2B cannot express)."""
    destinations: list[str] = []
    narrowed = False
    for entry in allow:
        for rule in policy.parse_entry(entry):
            narrowed = narrowed or rule.ports != policy.ANY_PORT
            destination = _destination(rule, entry)
            if destination not in destinations:
                destinations.append(destination)
    if narrowed and not _warned.is_set():
        _warned.set()
        log.warning("E2B's egress rules cannot restrict ports: a destination on an allow-list is reachable "
                    "on every port, whatever port its entry names (80 and 443 when it names none)")
    return {"allow_out": destinations, "deny_out": [ALL_IPV4]}


def allow_in_effect(recorded: Sequence[str] | None, actual: Sequence[str]) -> tuple[str, ...]:
    """The allow-list to report: the entries as last set when they are what E2B enforces (the
    record lives in the sandbox, where a command could change it), else E2B's own rules."""
    if recorded is not None:
        try:
            if sorted(egress_rules(recorded)["allow_out"]) == sorted(actual):
                return tuple(recorded)
        except SandboxError:
            pass
    return tuple(actual)


@dataclass(frozen=True)
class Posture:
    """How a sandbox reaches the network: the internet, nothing, or an allow-list (``allow`` not None)."""

    internet: bool
    allow: tuple[str, ...] | None = None

    @property
    def label(self) -> NetworkMode:
        """The portable network mode: "host", "none" or "proxy"."""
        if self.allow is not None:
            return "proxy"
        return "host" if self.internet else "none"

    def create_options(self) -> dict[str, Any]:
        """The options of ``Sandbox.create`` for this posture. With an allow-list the internet is
        off as well, so a service that ignored the rules would deny rather than allow."""
        if self.allow is None:
            return {"allow_internet_access": self.internet}
        return {"allow_internet_access": False, "network": egress_rules(self.allow)}

    def spec(self) -> SandboxSpec:
        return SandboxSpec(network=self.label, allow=self.allow or ())
