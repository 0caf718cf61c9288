"""The registry's way in: a LocalBackend from LocalSettings, or from their validated values."""

from __future__ import annotations

from collections.abc import Mapping

from hermes_sandboxes.backends.local.backend import LocalBackend
from hermes_sandboxes.errors import InvalidInput

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the hot path of a CLI exec)
if TYPE_CHECKING:
    from typing import Any

    from hermes_sandboxes.egress.broker import SecretLookup
    from hermes_sandboxes.settings import BackendSettings


def build_backend(settings: BackendSettings, secret_lookup: SecretLookup | None = None) -> LocalBackend:
    """``secret_lookup``: where brokered ``env`` credentials are read (default: this process's environment)."""
    from hermes_sandboxes.backends.local.settings import LocalSettings  # pydantic: only on this path

    if not isinstance(settings, LocalSettings):
        raise InvalidInput(f"the local backend takes LocalSettings, not {type(settings).__name__}")
    return LocalBackend(settings.store_home(), base=settings.base, masks=settings.masks,
                        credentials=settings.brokered_credentials(), upstream_ca=settings.upstream_ca,
                        secret_lookup=secret_lookup)


def from_values(values: Mapping[str, Any]) -> LocalBackend | None:
    """From ``LocalSettings.model_dump(mode="json")`` of settings validated before (the CLI's cache);
    the home falls back as ``LocalSettings.store_home`` does. None when the settings broker
    credentials or name an upstream CA: those take the full model."""
    import os

    if values.get("brokered") or values.get("upstream_ca"):
        return None
    home = values.get("home") or os.environ.get("HERMES_SANDBOXES_HOME") or "/var/lib/hermes-sandboxes"
    return LocalBackend(home, base=values.get("base"), masks=tuple(values.get("masks") or ()))
