"""Who a sandbox is: the metadata that names it in E2B, and the lifecycle it is made with."""

from __future__ import annotations

import hashlib

import e2b

from hermes_sandboxes.backends.e2b.settings import MAX_LEASE_SECONDS, E2BSettings

API_KEY_ENV = "E2B_API_KEY"
PLUGIN_KEY, PLUGIN_VALUE = "hermes_plugin", "e2b-terminal"  # shared with the existing E2B plugin
SCOPE_KEY = "hermes_scope"  # the existing plugin's digest: what it looks its sandboxes up by
IDENTITY_KEY = "hermes_sandboxes_identity"  # the same digest over our sandbox name, for the CLI and API
NAME_KEY = "hermes_sandboxes_name"  # our contract name, for ls/get
OWNER_KEY = "hermes_sandboxes_owner"  # digest of the profile: list() shows this profile's sandboxes
EPHEMERAL_KEY = "hermes_sandboxes_ephemeral"
CREATED_KEY = "hermes_sandboxes_created"
NETWORK_KEY = "hermes_sandboxes_network"  # "host" (internet), "none" (no egress) or "proxy", for ls
ALLOW_KEY = "hermes_sandboxes_allow"  # the allow-list a "proxy" sandbox was made with, space-separated
EPHEMERAL_FLOOR_S = 60 + 60  # one Hermes reaper interval + one control-plane request timeout
LEASE_HEADROOM_MAX_S = 30


def scope_digest(profile: str, task: str, settings: E2BSettings, *, persistent: bool) -> str:
    """The existing E2B plugin's ``hermes_scope``, byte for byte: sha256 over NUL-joined (the
    profile's home key, the task id or "default", the template, persistent/ephemeral, net/nonet,
    secure/insecure), cut to 32 hex digits. The Hermes plugin passes Hermes's task id (so each
    plugin adopts the other's sandboxes); the CLI and the Python API pass the sandbox's name."""
    raw = "\0".join((profile, task or "default", settings.template,
                     "persistent" if persistent else "ephemeral", _network_posture(settings),
                     "secure" if settings.secure else "insecure"))
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()[:32]


def _network_posture(settings: E2BSettings) -> str:
    """The existing plugin's "net"/"nonet", or (ours only) "allow" for an allow-list. The list's
    entries are not identity: they change in place (``set_allow``; the Hermes plugin applies an
    edited ``allow`` setting to the sandbox it resumes), as on the other backends."""
    if settings.allow is None:
        return "net" if settings.allow_internet_access else "nonet"
    return "allow"


def lifecycle(persistent: bool) -> e2b.SandboxLifecycle:
    """Persistent: pause at the lease's end, filesystem only (a resume cold-boots), and only an
    explicit connect resumes it. Ephemeral: killed at the lease's end."""
    if persistent:
        return {"on_timeout": {"action": "pause", "mode": "filesystem"}, "auto_resume": False}
    return {"on_timeout": "kill", "auto_resume": False}


def lease_request(need: int) -> int:
    """The lease to ask for when ``need`` seconds must be secured: the need plus a headroom (a tenth
    of it, 1 to 30 s), so the commands of the next moments find their lease already covered and
    make no request. Never past E2B's longest lease, unless the need itself is (E2B then refuses)."""
    headroom = max(1, min(LEASE_HEADROOM_MAX_S, need // 10))
    return min(need + headroom, max(need, MAX_LEASE_SECONDS))
