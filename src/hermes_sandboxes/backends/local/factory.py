"""The registry's way in: a LocalBackend from LocalSettings, or from their validated values."""

from __future__ import annotations

from collections.abc import Mapping

from hermes_sandboxes.backends.local.backend import LocalBackend
from hermes_sandboxes.errors import InvalidInput

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the hot path of a CLI exec)
if TYPE_CHECKING:
    from typing import Any

    from hermes_sandboxes.backends import BuildContext
    from hermes_sandboxes.settings import BackendSettings


def build_backend(settings: BackendSettings, context: BuildContext | None = None) -> LocalBackend:
    """From the context: where brokered ``env`` credentials are read (default: this process's
    environment) and where the egress proxy's audit log is (default: the host state's)."""
    from hermes_sandboxes.backends.local.settings import LocalSettings  # pydantic: only on this path

    if not isinstance(settings, LocalSettings):
        raise InvalidInput(f"the local backend takes LocalSettings, not {type(settings).__name__}")
    return LocalBackend(settings.store_home(), base=settings.base, masks=settings.masks,
                        credentials=settings.brokered_credentials(), upstream_ca=settings.upstream_ca,
                        secret_lookup=context.secret_lookup if context else None,
                        audit_path=context.audit_path if context else None)


def from_values(values: Mapping[str, Any], context: BuildContext | None = None) -> LocalBackend | None:
    """From ``LocalSettings.model_dump(mode="json")`` of settings validated before (the CLI's cache);
    the home falls back as ``LocalSettings.store_home`` does. None when the settings broker
    credentials or name an upstream CA: those take the full model."""
    import os

    from hermes_sandboxes.backends.local import paths

    if values.get("brokered") or values.get("upstream_ca"):
        return None
    home = values.get("home") or os.environ.get("HERMES_SANDBOXES_HOME") or paths.default_home()
    return LocalBackend(home, base=values.get("base"), masks=tuple(values.get("masks") or ()),
                        secret_lookup=context.secret_lookup if context else None,
                        audit_path=context.audit_path if context else None)
