"""The Hermes plugin ``sandbox``: the local sandbox backend (``terminal.backend: sandbox``)."""

from __future__ import annotations

from hermes_sandboxes.hermes.providers.base import SandboxProvider
from hermes_sandboxes.hermes.secrets import hermes_profile_secret
from hermes_sandboxes.sandbox import Backend
from hermes_sandboxes.settings import BackendSettings


class LocalProvider(SandboxProvider):
    plugin_id = "sandbox"
    backend_name = "local"
    label = "Local sandbox"
    summary = "Run commands in a local copy-on-write sandbox with checkpoint and restore."
    environment_text = "a local Linux sandbox (copy-on-write view of this machine, with checkpoints)"
    setup_text = (
        "The local sandbox needs Linux, root and btrfs-progs; sandboxes live under $HERMES_SANDBOXES_HOME "
        "(default /var/lib/hermes-sandboxes).",
        "Optional settings: name_prefix, scope (session|instance), network (none|loopback|host|proxy), allow, "
        "memory (e.g. 2G), pids, cpus, base, masks, home, auto_checkpoint (off|risky|always), retention, "
        "protected_paths, health_command, idle_timeout (e.g. 30m: stop an idle sandbox; the next command starts "
        "it again), credentials (program: SECRET_NAME).",
        "Commands have no network by default; set network: host to allow package installs.",
    )

    def make_backend(self, settings: BackendSettings) -> Backend:
        """The local backend, whose brokered credentials (``brokered.<NAME>.env``) are read from the
        active profile when a sandbox's proxy starts, as the cloud plugins read their tokens: the
        profile's secret scope, else (one profile per process) Hermes's environment and the
        profile's .env; nothing under a multiplexing gateway with no profile bound (fail closed).
        The backend object is shared by the profiles of a process; each call reads its own."""
        from hermes_sandboxes.backends.local.factory import build_backend

        return build_backend(settings, secret_lookup=hermes_profile_secret)
