"""Sandbox names: one rule for every backend and every face (CLI, Python API, Hermes plugin); and the
short digests that derive names of host resources (sockets, cgroups, state directories) from paths."""

from __future__ import annotations

import re

from hermes_sandboxes.errors import InvalidInput

MAX_NAME_LENGTH = 63  # a DNS label, so a name can become a hostname or a cloud resource name
# lowercase letters and digits in runs joined by single hyphens (a DNS label's alphabet)
NAME_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


TYPE_CHECKING = False  # (typing.TYPE_CHECKING without importing typing; type checkers know the name)
if TYPE_CHECKING:
    from hashlib import sha256
else:
    try:  # the interpreter's own sha256 (as ``random`` takes its sha512): hashlib would load OpenSSL,
        from _sha256 import sha256  # ~2 ms on every CLI exec; the module is _sha2 from Python 3.12
    except ImportError:  # pragma: no cover - another interpreter
        from hashlib import sha256


def digest(text: str, length: int) -> str:
    """The first ``length`` hex digits of ``text``'s SHA-256: a stable, short name derived from it."""
    return sha256(text.encode()).hexdigest()[:length]


def is_valid_name(name: str) -> bool:
    return len(name) <= MAX_NAME_LENGTH and NAME_RE.match(name) is not None


def validate_name(name: str) -> str:
    """Return ``name`` if it is a valid sandbox name, else raise InvalidInput saying why."""
    if not isinstance(name, str) or not name:
        raise InvalidInput("sandbox name is empty: use lowercase letters, digits and single hyphens")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidInput(f"sandbox name {name[:20]!r}... is {len(name)} characters; at most 63 are allowed")
    if not NAME_RE.match(name):
        raise InvalidInput(
            f"invalid sandbox name {name!r}: use lowercase letters, digits and single hyphens, "
            "not starting or ending with a hyphen"
        )
    return name


def unique_name(prefix: str) -> str:
    """A run-unique name under ``prefix`` (itself a valid name), for ephemeral sandboxes."""
    import secrets  # (random, hmac, base64: not for the hot path of an exec)

    validate_name(prefix)
    suffix = secrets.token_hex(5)
    return validate_name(f"{prefix[: MAX_NAME_LENGTH - len(suffix) - 1]}-{suffix}")
