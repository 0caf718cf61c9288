"""The Hermes plugin ``sprites``: the Sprites backend (``terminal.backend: sprites``), a drop-in for
the existing Sprites plugin: same plugin id, same settings keys, same Sprite names.

Names (``prefix`` is ``name_prefix``, ``hermes`` by default, never truncated):

* default profile: ``<prefix>-<task>``, the task id as it is when it is already a clean DNS label,
  else its collapsed form plus six hex digits of its digest, so ``team_prod`` and ``team-prod``
  never share a Sprite; too long for a label: ``<prefix>-<display>-<digest12>``;
* named profiles (and a custom HERMES_HOME, as ``home:<path>``): ``<prefix>-<profile>-<task>-<digest12>``
  where the digest covers the length-prefixed raw (profile, task) pair, so no boundary shift or
  display collision can make two identities meet; the display part absorbs any shortening;
* ephemeral runs: ``<prefix>-eph-<task>-<nonce12>``, fresh every time, never adopted.

The token comes from the active profile (``SPRITES_TOKEN``, then ``SPRITE_TOKEN``) and fails closed
under a multi-profile gateway with no profile bound; each profile's token gets its own backend.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from pathlib import Path

from hermes_sandboxes.errors import InvalidInput
from hermes_sandboxes.hermes.naming import Profile
from hermes_sandboxes.hermes.providers.base import SandboxProvider
from hermes_sandboxes.hermes.secrets import hermes_profile_secret
from hermes_sandboxes.names import MAX_NAME_LENGTH, validate_name
from hermes_sandboxes.settings import BackendSettings

DIGEST_LENGTH = 12
TOKEN_NAMES = ("SPRITES_TOKEN", "SPRITE_TOKEN")
_NON_SLUG = re.compile(r"[^a-z0-9]+")


def _collapse(value: str) -> str:
    return _NON_SLUG.sub("-", value.lower()).strip("-")


def identity_digest(*parts: str) -> str:
    """12 hex digits over length-prefixed parts: unambiguous whatever bytes the parts hold."""
    h = hashlib.sha256()
    for part in parts:
        raw = part.encode("utf-8")
        h.update(len(raw).to_bytes(4, "big"))
        h.update(raw)
    return h.hexdigest()[:DIGEST_LENGTH]


def _component(value: str) -> str:
    """A clean value as it is; a lossy one collapsed plus a short digest of the raw value."""
    slug = _collapse(value)
    if slug == value:
        return slug
    tag = hashlib.sha256(value.encode("utf-8")).hexdigest()[:6]
    return f"{slug}-{tag}" if slug else tag


def _bounded(prefix: str, display: str, digest: str) -> str:
    room = MAX_NAME_LENGTH - len(prefix) - 2 - len(digest)
    if room < 0:
        raise InvalidInput(f"name_prefix {prefix!r} leaves no room for a Sprite name within {MAX_NAME_LENGTH}")
    display = display[:room].strip("-")
    return validate_name(f"{prefix}-{display}-{digest}" if display else f"{prefix}-{digest}")


def profile_identity(profile: Profile) -> str | None:
    """Who the Sprite belongs to, as the existing plugin reads it: None for the default profile
    (the Hermes root, or ``<root>/profiles/default``), the directory name for any one directory
    under ``<root>/profiles/`` (also one Hermes itself would not create, such as ``Work.Old``), and
    ``home:<path>`` for any other HERMES_HOME (its own trust domain). Deliberately not as upstream:
    a home nested deeper (``profiles/work/x``, ``profiles/default/x``) stays ``home:<path>``, where
    upstream would hand it the Sprites of profile ``work`` or of the default profile."""
    if profile.name == "default":
        return None
    if profile.root:
        try:
            parts = Path(profile.home).relative_to(Path(profile.root) / "profiles").parts
        except ValueError:
            parts = ()
        if len(parts) == 1:
            return None if parts[0] == "default" else parts[0]
    if profile.name == "custom":
        return f"home:{profile.home}"
    return profile.name


def sprite_name(prefix: str, profile: Profile, task_key: str) -> str:
    """The persistent Sprite of ``task_key`` on ``profile``; ``task_key`` as Hermes gave it (an
    empty one shows as ``default`` but, on a named profile, is digested as empty, as upstream does)."""
    owner = profile_identity(profile)
    if owner is None:
        plain = f"{prefix}-{_component(task_key) or 'default'}"
        if len(plain) <= MAX_NAME_LENGTH:
            return validate_name(plain)
        return _bounded(prefix, _collapse(task_key), identity_digest("", task_key))
    display = f"{_collapse(owner) or 'profile'}-{_collapse(task_key) or 'default'}"
    return _bounded(prefix, display, identity_digest(owner, task_key))


def ephemeral_sprite_name(prefix: str, task_key: str) -> str:
    return _bounded(prefix, f"eph-{_collapse(task_key) or 'default'}", secrets.token_hex(6))


class SpritesProvider(SandboxProvider):
    plugin_id = "sprites"
    uses_writer_lease = True
    backend_name = "sprites"
    label = "Sprites"
    settings_label = "Sprites naming"
    summary = "Run commands in a Fly.io Sprite: a persistent cloud VM with checkpoints."
    environment_text = "a Fly.io Sprite (a cloud VM; its filesystem persists, with checkpoints)"
    setup_text = (
        "Install the SDK in Hermes's Python: pip install -e '/path/to/checkout[hermes,sprites]'.",
        "Put SPRITES_TOKEN=... (a token from your organization's Sprites settings) in the profile's .env.",
        "Optional settings: name_prefix, scope (session|instance), "
        "allow (an egress allow-list), max_cpus, max_ram_gb, max_disk_gb, api_url, auto_checkpoint, retention, "
        "credentials.",
    )

    def _token(self) -> str | None:
        for name in TOKEN_NAMES:
            value = hermes_profile_secret(name)
            if value:
                return value
        return None

    def backend_identity(self, settings: BackendSettings) -> str:
        token = self._token() or ""
        return hashlib.sha256(token.encode()).hexdigest()  # which account: never the token itself

    def persistent_name(self, prefix: str, profile: Profile, task_key: str) -> str:
        return sprite_name(prefix, profile, task_key)

    def ephemeral_name(self, prefix: str, profile: Profile, task_key: str) -> str:
        return ephemeral_sprite_name(prefix, task_key)
