"""The Hermes plugin ``sandbox``: the local sandbox backend (``terminal.backend: sandbox``).

Its brokered credentials (``brokered.<NAME>.env``) are read from the active profile when a
sandbox's proxy starts, as the cloud plugins read their tokens (``SandboxProvider.build_context``)."""

from __future__ import annotations

from hermes_sandboxes.hermes.providers.base import SandboxProvider


class LocalProvider(SandboxProvider):
    plugin_id = "sandbox"
    backend_name = "local"
    label = "Local sandbox"
    summary = "Run commands in a local copy-on-write sandbox with checkpoint and restore."
    environment_text = "a local Linux sandbox (copy-on-write view of this machine, with checkpoints)"
    setup_text = (
        "The local sandbox needs Linux: as root it uses btrfs-progs and its sandboxes live under "
        "$HERMES_SANDBOXES_HOME (default /var/lib/hermes-sandboxes); as a normal user it is rootless (uidmap, "
        "a base built once with `hermes-sandboxes store base`; default ~/.local/share/hermes-sandboxes).",
        "Optional settings: name_prefix, scope (session|instance), network (none|loopback|host|proxy), allow, "
        "memory (e.g. 2G), pids, cpus, base, masks, home, auto_checkpoint (off|risky|always), retention, "
        "protected_paths, health_command, idle_timeout (e.g. 30m: stop an idle sandbox; the next command starts "
        "it again), credentials (program: SECRET_NAME).",
        "Commands have no network by default; set network: host to allow package installs.",
    )
