"""Credential brokering: the sandbox holds a placeholder, the proxy adds the secret on the wire.

A ``BrokeredCredential`` names the variable a tool reads (``GITHUB_TOKEN``), where the real value
lives on the host (an environment variable or a file, never a literal in a settings file) and the
hosts it is for. Commands in the sandbox get a placeholder in that variable. The proxy looks for
placeholders in each request's head (``Authorization: Basic`` is decoded, so a token used as a
git password is found too):

- on a TLS connection to one of the credential's hosts, the placeholder is replaced by the secret
  in the headers the credential names (``Authorization`` unless it says otherwise), and only there:
  a placeholder in any other header (``User-Agent``, a header an endpoint echoes) or in the URL
  stays the placeholder;
- on a plain-HTTP connection to one of its hosts, a request with the placeholder in one of those
  headers is refused: the secret never travels in cleartext;
- on any other connection, a request that carries a placeholder anywhere in its head (URL
  included) is refused, so a tool cannot be talked into sending it elsewhere.

Only request heads are rewritten; a placeholder in a body is passed on as it is (the body is
never read), which exposes nothing since the placeholder is not the secret.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import os
import re
import secrets as _random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermes_sandboxes.allowlist import AllowList, IPAddress, parse_entry
from hermes_sandboxes.egress.http import RequestHead
from hermes_sandboxes.errors import InvalidInput

SecretLookup = Callable[[str], str | None]  # a variable's name -> its value, None when unset or unknowable
_VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_HEADER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}$")
DEFAULT_HEADERS = ("Authorization",)


@dataclass(frozen=True)
class BrokeredCredential:
    name: str  # the variable the tool expects, e.g. GITHUB_TOKEN
    hosts: tuple[str, ...]  # allow-list syntax: names, *.domains, addresses, optional ports
    env: str | None = None  # the host environment variable holding the value
    file: str | None = None  # or the host file holding it (surrounding whitespace dropped)
    headers: tuple[str, ...] = DEFAULT_HEADERS  # the request headers the secret may be put into

    def __post_init__(self) -> None:
        if not _VARIABLE.match(self.name):
            raise InvalidInput(f"credential name {self.name!r} must be an environment variable name")
        if not self.hosts:
            raise InvalidInput(f"credential {self.name}: name the hosts it is for")
        for host in self.hosts:
            parse_entry(host)
        if (self.env is None) == (self.file is None):
            raise InvalidInput(f"credential {self.name}: give exactly one value source, env or file")
        if self.env is not None and not _VARIABLE.match(self.env):
            raise InvalidInput(f"credential {self.name}: env {self.env!r} is not a variable name")
        if self.file is not None and not os.path.isabs(self.file):
            raise InvalidInput(f"credential {self.name}: file {self.file!r} must be an absolute path")
        if not self.headers or not all(isinstance(h, str) and _HEADER.match(h) for h in self.headers):
            raise InvalidInput(f"credential {self.name}: headers must be a non-empty list of header names")
        if any(h.lower() == "host" or h.lower().startswith("proxy-") for h in self.headers):
            raise InvalidInput(f"credential {self.name}: headers may not name Host or Proxy-* headers")

    def load(self, lookup: SecretLookup | None = None) -> str | None:
        """The secret from its source on the host, or None when that source is empty or missing.
        An ``env`` source is read through ``lookup`` when given (the Hermes plugin reads the active
        profile's secrets so), else from this process's environment."""
        if self.env is not None:
            return (lookup(self.env) if lookup is not None else os.environ.get(self.env)) or None
        try:
            return Path(str(self.file)).read_text().strip() or None
        except (OSError, UnicodeDecodeError):
            return None

    def describe(self) -> dict[str, object]:
        """Where the value comes from, never the value (what host-side records keep)."""
        return {"name": self.name, "hosts": list(self.hosts), "env": self.env, "file": self.file,
                "headers": list(self.headers)}


def new_placeholder(name: str) -> str:
    """A value no real token has, recognisable in logs as ours."""
    return f"hsb-placeholder-{name.lower()}-{_random.token_hex(12)}"


class CredentialRefused(Exception):
    """A request carries a placeholder to a host its credential is not for, or in cleartext."""


@dataclass(frozen=True)
class _Entry:
    name: str
    placeholder: str
    secret: str | None
    hosts: AllowList
    headers: frozenset[str]  # lower-case names of the headers the secret may go into


class Broker:
    """Swaps placeholders for secrets in request heads, for the hosts each credential names."""

    def __init__(self, credentials: Sequence[Mapping[str, Any]], secrets: Mapping[str, str]) -> None:
        """``credentials``: dicts with name, hosts, placeholder and headers (default Authorization);
        ``secrets``: name -> value."""
        self._entries = [
            _Entry(str(c["name"]), str(c["placeholder"]), secrets.get(str(c["name"])),
                   AllowList([str(h) for h in c["hosts"]]),
                   frozenset(str(h).lower() for h in c.get("headers") or DEFAULT_HEADERS))
            for c in credentials
        ]

    def __bool__(self) -> bool:
        return bool(self._entries)

    def secrets(self) -> dict[str, str]:
        return {e.name: e.secret for e in self._entries if e.secret}

    @staticmethod
    def _for_host(entry: _Entry, host: str, port: int) -> bool:
        try:
            address: IPAddress | None = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            address = None
        return any(rule.allows_port(port) and (rule.matches_name(host.lower()) if address is None else
                                               rule.network is not None and address in rule.network)
                   for rule in entry.hosts.rules)

    def apply(self, host: str, port: int, head: RequestHead, *, tls: bool) -> str | None:
        """Rewrite ``head`` in place for ``host:port`` (``tls``: the connection to the server is
        encrypted); the credential used, if any. Raises CredentialRefused."""
        used: str | None = None
        for entry in self._entries:
            in_target = entry.placeholder in head.target
            named = [k.lower() in entry.headers and entry.placeholder in _visible(v) for k, v in head.headers]
            if not (in_target or any(named) or any(entry.placeholder in _visible(v) for _, v in head.headers)):
                continue
            if not self._for_host(entry, host, port):
                raise CredentialRefused(f"the request carries the placeholder of credential {entry.name}, "
                              f"which is not for {host}:{port}")
            if not any(named):
                continue  # only where the credential says: elsewhere it stays the placeholder
            if not tls:
                raise CredentialRefused(f"credential {entry.name} is sent over TLS only: use https://")
            if entry.secret is None:
                raise CredentialRefused(f"credential {entry.name} has no value on the host (its source is unset)")
            head.headers = [(k, _swap(v, entry.placeholder, entry.secret) if swap else v)
                            for (k, v), swap in zip(head.headers, named, strict=True)]
            used = entry.name
        return used


def _basic(value: str) -> str | None:
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        return base64.b64decode(token.strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


def _visible(value: str) -> str:
    """A header value as the placeholder may appear in it (Basic credentials decoded)."""
    decoded = _basic(value)
    return value if decoded is None else f"{value} {decoded}"


def _swap(value: str, placeholder: str, secret: str) -> str:
    decoded = _basic(value)
    if decoded is not None and placeholder in decoded:
        scheme = value.partition(" ")[0]
        return f"{scheme} {base64.b64encode(decoded.replace(placeholder, secret).encode()).decode()}"
    return value.replace(placeholder, secret)
