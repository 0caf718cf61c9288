"""Which sandbox a Hermes task uses: deterministic, profile-scoped, DNS-bounded names.

A persistent name is ``<prefix>-<hint>-<digest>``. The hint is a readable, truncated form of the task
key; the 12-hex-digit digest covers the prefix, the profile's home directory, the mode and the full,
untruncated task key, each length-prefixed, so two different tuples cannot produce the same input by
moving a boundary (``("ab", "c")`` vs ``("a", "bc")``) and truncating the hint loses nothing.
The profile is identified by its resolved home directory, so two profiles (or two test homes) never
share a sandbox; if Hermes cannot say which profile is active we refuse instead of guessing, because
guessing "default" would hand one profile's files to another.

Ephemeral names (``terminal.container_persistent: false``) add a random nonce to the digest input:
they are run-unique, never resumed, and destroyed on cleanup.
"""

from __future__ import annotations

import hashlib
import importlib
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from hermes_sandboxes.errors import InvalidInput
from hermes_sandboxes.names import MAX_NAME_LENGTH, validate_name

DIGEST_LENGTH = 12
_DOMAIN = b"hermes-sandboxes/name/v1"
_NON_NAME = re.compile(r"[^a-z0-9]+")


class ProfileUnresolved(InvalidInput):
    """Hermes could not tell which profile this call serves; no sandbox is chosen."""


@dataclass(frozen=True)
class Profile:
    name: str  # "default", a named profile, or "custom" for any other HERMES_HOME
    home: str  # resolved home directory: the identity that goes into the digest
    root: str = ""  # resolved Hermes root (the parent of profiles/); "" when not known


def resolve_profile() -> Profile:
    """The active Hermes profile, or ProfileUnresolved. Never falls back to the default profile."""
    try:
        constants = importlib.import_module("hermes_constants")
        profiles = importlib.import_module("hermes_cli.profiles")
        home = Path(constants.get_hermes_home())
        name = str(profiles.get_active_profile_name())
        root = Path(constants.get_default_hermes_root()).resolve()
    except Exception as exc:
        raise ProfileUnresolved(
            f"cannot resolve the active Hermes profile ({exc}); refusing to pick a sandbox"
        ) from exc
    if not home.is_absolute() or not home.is_dir():
        raise ProfileUnresolved(
            f"the active Hermes profile's home {str(home)!r} does not exist; refusing to pick a sandbox"
        )
    return Profile(name=name, home=str(home.resolve()), root=str(root))


def _digest(*fields: str) -> str:
    h = hashlib.sha256(_DOMAIN)
    for f in fields:
        raw = f.encode("utf-8")
        h.update(len(raw).to_bytes(4, "big"))
        h.update(raw)
    return h.hexdigest()[:DIGEST_LENGTH]


def _hint(text: str, room: int) -> str:
    cleaned = _NON_NAME.sub("-", text.lower()).strip("-")
    return cleaned[:room].rstrip("-")


def _compose(prefix: str, hint_text: str, digest: str) -> str:
    room = MAX_NAME_LENGTH - len(prefix) - len(digest) - 2
    hint = _hint(hint_text, room) if room > 0 else ""
    return validate_name(f"{prefix}-{hint}-{digest}" if hint else f"{prefix}-{digest}")


def _key_hint(profile: Profile, task_key: str) -> str:
    return task_key if profile.name == "default" else f"{profile.name}-{task_key}"


def persistent_name(prefix: str, profile: Profile, task_key: str) -> str:
    """The one sandbox this profile's ``task_key`` resumes (``default`` for CLI and cron)."""
    digest = _digest(prefix, profile.home, "persistent", task_key)
    return _compose(prefix, _key_hint(profile, task_key), digest)


def ephemeral_name(prefix: str, profile: Profile, task_key: str) -> str:
    """A run-unique name: a fresh nonce each call, so no two runs ever attach the same sandbox."""
    nonce = secrets.token_hex(8)
    digest = _digest(prefix, profile.home, "ephemeral", task_key, nonce)
    return _compose(prefix, "tmp-" + _key_hint(profile, task_key), digest)


def task_key_for_scope(task_key: str, scope: str) -> str:
    """``instance`` scope collapses every task of a profile onto its default sandbox."""
    return "default" if scope == "instance" else task_key


def within_prefix(prefix: str, name: str) -> bool:
    return name.startswith(prefix + "-")


def require_within_prefix(prefix: str, name: str) -> str:
    """Refuse to act on a sandbox this install's ``name_prefix`` does not cover."""
    if not within_prefix(prefix, name):
        raise InvalidInput(
            f"sandbox {name!r} is outside this plugin's name_prefix {prefix!r}; refusing to touch it"
        )
    return name
