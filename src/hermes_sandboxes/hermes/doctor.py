"""Rows for ``hermes doctor`` and ``hermes status --full``: can the backend run here, are the settings
valid, is the backend healthy. Each row is ``(ok, label, detail)``; a failing row says what to do."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hermes_sandboxes.settings import BackendSettings, InvalidSettings

if TYPE_CHECKING:
    from hermes_sandboxes.hermes.providers.base import SandboxProvider

Row = tuple[bool, str, str]


def _settings_row(settings: BackendSettings) -> str:
    shown = settings.display()
    parts = [f"prefix {settings.name_prefix}", f"scope {settings.scope}"]
    if "network" in shown:
        parts.append(f"network {shown['network']}")
    parts.append(f"auto_checkpoint {settings.auto_checkpoint}")
    if settings.credentials:
        parts.append("credentials for " + ", ".join(sorted(settings.credentials)))
    return "valid (" + ", ".join(parts) + ")"


def doctor_rows(provider: SandboxProvider) -> list[Row]:
    """Never raises: a doctor that crashes hides every other row."""
    label = provider.label
    settings_label = provider.settings_label or f"{label} settings"
    rows: list[Row] = []
    try:
        reason = provider.unavailable_reason()
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
    rows.append((reason is None, f"{label} backend", "usable on this machine" if reason is None else reason))
    settings: BackendSettings | None = None
    try:
        settings = provider.settings()
        rows.append((True, settings_label, _settings_row(settings)))
    except InvalidSettings as exc:
        rows.append((False, settings_label, f"invalid, the backend refuses to start: {exc}"))
    except Exception as exc:
        rows.append((False, settings_label, f"could not be read: {type(exc).__name__}: {exc}"))
    if reason is not None or settings is None:
        return rows
    try:
        checks = provider.backend(settings).doctor()
        failing = [c for c in checks if not c.ok]
        if failing:
            rows.append((False, f"{label} health", "; ".join(f"{c.label}: {c.detail}" for c in failing)))
        else:
            store = next((c for c in checks if c.label == "sandbox store"), None)
            rows.append((True, f"{label} health", store.detail if store else "healthy"))
    except Exception as exc:
        rows.append((False, f"{label} health", f"{type(exc).__name__}: {exc}"))
    return rows
