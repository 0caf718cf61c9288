"""Secrets as Hermes keeps them: per profile, failing closed."""

from __future__ import annotations

import importlib
import logging
from pathlib import Path

logger = logging.getLogger(__name__)


def hermes_profile_secret(name: str) -> str | None:
    """The secret ``name`` from the active Hermes profile, or None when it is unset or unknowable.

    Fails closed: when Hermes serves several profiles and no profile scope is bound to this call,
    ``get_secret`` raises and we return None instead of reading the launch profile's environment.
    When Hermes did not load the profile's ``.env`` into the process (tests, embedded use), the
    profile's own ``.env`` file is read, never another profile's.
    """
    try:
        scope = importlib.import_module("agent.secret_scope")
        constants = importlib.import_module("hermes_constants")
    except ImportError:
        return None
    try:
        value = scope.get_secret(name)
    except scope.UnscopedSecretError:
        logger.warning("secret %s refused: no profile scope is bound to this call", name)
        return None
    if value is None and not scope.is_multiplex_active():
        env_file = Path(constants.get_hermes_home()) / ".env"
        if env_file.is_file():
            value = scope.load_env_file(env_file).get(name)
    return str(value) if value else None
