"""Which of our providers this process has registered: the agent tools and ``hermes sandbox`` act on
the one that is the active terminal backend."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hermes_sandboxes.hermes.providers.base import SandboxProvider

_lock = threading.Lock()
_providers: dict[str, SandboxProvider] = {}


def remember(provider: SandboxProvider) -> None:
    with _lock:
        _providers[provider.plugin_id] = provider


def registered() -> dict[str, SandboxProvider]:
    with _lock:
        return dict(_providers)


def active_terminal_backend() -> str:
    """``terminal.backend`` as Hermes resolved it for this profile."""
    try:
        from tools.terminal_scope import terminal_env

        return str(terminal_env("TERMINAL_ENV", "local")).strip().lower()
    except Exception:
        return ""


def active() -> SandboxProvider | None:
    """The provider of ours that is the active terminal backend, if any."""
    return registered().get(active_terminal_backend())
