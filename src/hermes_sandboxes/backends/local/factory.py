"""The registry's way in: a LocalBackend from LocalSettings."""

from __future__ import annotations

from hermes_sandboxes.backends.local.backend import LocalBackend
from hermes_sandboxes.backends.local.settings import LocalSettings
from hermes_sandboxes.errors import InvalidInput
from hermes_sandboxes.settings import BackendSettings


def build_backend(settings: BackendSettings) -> LocalBackend:
    if not isinstance(settings, LocalSettings):
        raise InvalidInput(f"the local backend takes LocalSettings, not {type(settings).__name__}")
    return LocalBackend(settings.store_home(), base=settings.base, masks=settings.masks,
                        credentials=settings.brokered_credentials(), upstream_ca=settings.upstream_ca)
