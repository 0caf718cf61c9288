"""The portable egress allow-list (network "proxy", see allowlist.py) as a Sprite's network policy.

The service keeps one policy per Sprite (``GET``/``POST /v1/sprites/{name}/policy/network``, a body
``{"rules": [{"domain": ..., "action": "allow"|"deny"} | {"include": "defaults"}]}``; sprites-go
``policy.go`` and ``types.go``, the networking concept page of superfly/sprites-docs). It works
through DNS: a name the policy refuses gets DNS REFUSED, the most specific rule wins (an exact name,
then ``*.domain``, then ``*``), raw addresses are blocked unless they came from an allowed name,
private addresses are always blocked, and no rules means no restriction. An allow-list therefore
becomes one ``allow`` rule per name (presets expanded) and a final ``{"domain": "*", "action":
"deny"}``, so anything the list does not name is refused. What the policy cannot say:

* ports: a rule names a domain, not a port, so an entry's port (or the 80 and 443 an entry without
  one means elsewhere) is not enforced; a warning says so once per process;
* addresses: an entry that is an IP address or network has no rule (the service blocks raw
  addresses unless a name it allowed resolved to them, and private ones always): it is kept in the
  list as written and reaches nothing, with a warning once per process. The list then reaches less
  than it says, never more.

``*`` (any public name) is ``{"domain": "*", "action": "allow"}``: the service blocks private
addresses itself. The Go SDK expects 204 from an update, the API reference shows 200: both are taken.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from hermes_sandboxes import allowlist as policy

log = logging.getLogger(__name__)
_warned_ports = threading.Event()
_warned_addresses = threading.Event()
DENY_REST = {"domain": "*", "action": "deny"}


def policy_rules(allow: Sequence[str]) -> list[dict[str, str]]:
    """The network policy's rules for the allow-list ``allow`` (InvalidInput for a bad entry)."""
    names: list[str] = []
    narrowed = addresses = False
    for entry in allow:
        for rule in policy.parse_entry(entry):
            narrowed = narrowed or rule.ports != policy.ANY_PORT
            if rule.network is not None:
                addresses = True
                continue
            assert rule.name is not None
            if rule.name not in names:
                names.append(rule.name)
    _warn(narrowed, addresses)
    rules = [{"domain": name, "action": "allow"} for name in names]
    return rules if "*" in names else [*rules, dict(DENY_REST)]


def _warn(narrowed: bool, addresses: bool) -> None:
    if narrowed and not _warned_ports.is_set():
        _warned_ports.set()
        log.warning("a Sprite's network policy matches names, not ports: a name on an allow-list is reachable "
                    "on every port, whatever port its entry names (80 and 443 when it names none)")
    if addresses and not _warned_addresses.is_set():
        _warned_addresses.set()
        log.warning("a Sprite's network policy cannot allow an IP address or network (it blocks raw addresses "
                    "unless an allowed name resolved to them, private ones always): such entries reach nothing")


def rules_in(data: Any) -> list[dict[str, str]]:
    """The rules of a policy answer, as plain dicts of text."""
    rules = data.get("rules") if isinstance(data, Mapping) else None
    return [{str(k): str(v) for k, v in r.items()} for r in rules or () if isinstance(r, Mapping)]


def allow_in_effect(recorded: Sequence[str] | None, actual: list[dict[str, str]]) -> tuple[str, ...]:
    """The allow-list to report: the entries as last set when they are what the service enforces
    (the record lives in the Sprite, where a command could change it), else the allowed names."""
    if recorded is not None:
        try:
            if _same(policy_rules(recorded), actual):
                return tuple(recorded)
        except Exception:  # a record no longer valid: the service's own rules instead
            pass
    return tuple(r["domain"] for r in actual if r.get("action") == "allow" and r.get("domain"))


def _same(a: list[dict[str, str]], b: list[dict[str, str]]) -> bool:
    return sorted(map(sorted, (r.items() for r in a))) == sorted(map(sorted, (r.items() for r in b)))
