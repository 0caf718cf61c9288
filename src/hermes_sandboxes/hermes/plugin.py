"""Entry point ``hermes_agent.plugins: sandbox = hermes_sandboxes.hermes.plugin:register``.

``register`` must be fast (Hermes gives it 10 s) and must not crash Hermes: it only builds the
provider and registers it with the agent tools and the ``hermes sandbox`` command. Nothing touches
the store until the first command. If Hermes lacks an optional registration method (older builds),
that part is skipped with one log line.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)


def register(ctx: Any) -> None:
    try:
        from .provider import LocalSandboxProvider
    except ImportError as exc:
        logger.warning("hermes-sandboxes: the sandbox backend is unavailable (%s)", exc)
        return
    provider = LocalSandboxProvider()
    ctx.register_terminal_environment_provider(provider)

    from .tools import register_tools

    register_tools(ctx)
    if hasattr(ctx, "register_cli_command"):
        from .cli import register_cli

        register_cli(ctx, provider)
    else:
        logger.info("hermes-sandboxes: this Hermes has no plugin CLI commands; `hermes sandbox` is skipped")
