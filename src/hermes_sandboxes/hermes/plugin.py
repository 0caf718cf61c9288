"""Entry points ``hermes_agent.plugins``: one ``register`` per provider (``sandbox`` today; the cloud
backends add theirs the same way).

``register`` must be fast (Hermes gives it 10 s) and must not crash Hermes: it only builds the
provider and registers it, plus the agent tools, the ``/sandbox`` slash command with its pre-turn hook
(slash.py) and the ``hermes sandbox`` command, which are shared
by all our providers and registered once per process. Nothing touches a store or the network until
the first command. If Hermes lacks an optional registration method (older builds), that part is
skipped with one log line.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

logger = logging.getLogger(__name__)

_shared_lock = threading.Lock()
_shared_done: weakref.WeakSet[Any] = weakref.WeakSet()  # the plugin managers the shared parts went to


def register_provider(ctx: Any, provider_class: str) -> None:
    """Register the provider ``provider_class`` ("module:Class" under this package) with ``ctx``."""
    try:
        from importlib import import_module

        module, _, name = provider_class.partition(":")
        provider = getattr(import_module(module, __package__), name)()
    except ImportError as exc:
        logger.warning("hermes-sandboxes: the %s backend is unavailable (%s)", provider_class, exc)
        return
    ctx.register_terminal_environment_provider(provider)
    from hermes_sandboxes.hermes.providers.registry import remember

    remember(provider)
    with _shared_lock:
        manager = getattr(ctx, "_manager", ctx)
        first = manager not in _shared_done
        _shared_done.add(manager)
    if not first:
        return
    from hermes_sandboxes.hermes.tools import register_tools

    register_tools(ctx)
    from hermes_sandboxes.hermes.slash import register_slash

    register_slash(ctx)
    if hasattr(ctx, "register_cli_command"):
        from hermes_sandboxes.hermes.cli import register_cli

        register_cli(ctx)
    else:
        logger.info("hermes-sandboxes: this Hermes has no plugin CLI commands; `hermes sandbox` is skipped")


def register(ctx: Any) -> None:
    """``sandbox``: the local sandbox backend."""
    register_provider(ctx, ".providers.local:LocalProvider")


def register_sprites(ctx: Any) -> None:
    """``sprites``: Fly.io Sprites."""
    register_provider(ctx, ".providers.sprites:SpritesProvider")


def register_e2b(ctx: Any) -> None:
    """``e2b``: E2B cloud sandboxes."""
    register_provider(ctx, ".providers.e2b:E2BProvider")
