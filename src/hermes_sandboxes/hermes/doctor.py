"""Rows for ``hermes doctor`` and ``hermes status --full``: can it run here, are the settings valid,
is the store healthy. Each row is ``(ok, label, detail)``; a failing row says what to do."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hermes_sandboxes.settings import InvalidSettings, LocalSettings

if TYPE_CHECKING:
    from .provider import LocalSandboxProvider

Row = tuple[bool, str, str]


def _settings_row(settings: LocalSettings) -> str:
    parts = [
        f"prefix {settings.name_prefix}",
        f"scope {settings.scope}",
        f"network {settings.network}",
        f"auto_checkpoint {settings.auto_checkpoint}",
    ]
    if settings.credentials:
        parts.append("credentials for " + ", ".join(sorted(settings.credentials)))
    return "valid (" + ", ".join(parts) + ")"


def doctor_rows(provider: LocalSandboxProvider) -> list[Row]:
    """Never raises: a doctor that crashes hides every other row."""
    rows: list[Row] = []
    try:
        reason = provider.unavailable_reason()
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
    usable = "usable on this machine"
    rows.append((reason is None, "Local sandbox backend", usable if reason is None else reason))
    settings: LocalSettings | None = None
    try:
        settings = provider.settings()
        rows.append((True, "Sandbox settings", _settings_row(settings)))
    except InvalidSettings as exc:
        rows.append((False, "Sandbox settings", f"invalid, the backend refuses to start: {exc}"))
    except Exception as exc:
        rows.append((False, "Sandbox settings", f"could not be read: {type(exc).__name__}: {exc}"))
    if reason is not None or settings is None:
        return rows
    try:
        backend = provider.backend(settings)
        checks = backend.doctor()
        failing = [c for c in checks if not c.ok]
        store = next((c for c in checks if c.label == "sandbox store"), None)
        if failing:
            rows.append((False, "Sandbox store", "; ".join(f"{c.label}: {c.detail}" for c in failing)))
        else:
            rows.append((True, "Sandbox store", store.detail if store else "healthy"))
    except Exception as exc:
        rows.append((False, "Sandbox store", f"{type(exc).__name__}: {exc}"))
    return rows
