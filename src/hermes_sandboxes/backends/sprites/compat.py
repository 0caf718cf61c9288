"""Names of the contract this backend uses that are being added to the core (issue 7, "One core,
any backend"): the error classes by cause and the newer capabilities and states. Each resolves to
the core's own name once it exists there, and to a stand-in with the same meaning until then, so
callers catching ``SandboxError`` / ``ExecFailed`` / ``BackendUnavailable`` are served either way.
"""

from __future__ import annotations

from hermes_sandboxes import errors, sandbox
from hermes_sandboxes.errors import BackendUnavailable, ExecFailed, SandboxError


class _AuthenticationFailed(BackendUnavailable):
    """The service refused our credentials (missing, wrong or expired token)."""


class _RateLimited(ExecFailed):
    """The service asked us to slow down; ``retry_after`` is its hint in seconds, if it gave one."""

    retryable = True

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class _SandboxUnreachable(ExecFailed):
    """The sandbox or its service cannot be reached now (lost connection, 5xx); try again."""

    retryable = True


class _QuotaExceeded(ExecFailed):
    """An account quota or a limit of the service was reached."""


AuthenticationFailed: type[SandboxError] = getattr(errors, "AuthenticationFailed", _AuthenticationFailed)
RateLimited: type[SandboxError] = getattr(errors, "RateLimited", _RateLimited)
SandboxUnreachable: type[SandboxError] = getattr(errors, "SandboxUnreachable", _SandboxUnreachable)
QuotaExceeded: type[SandboxError] = getattr(errors, "QuotaExceeded", _QuotaExceeded)


def rate_limited(message: str, retry_after: float | None) -> SandboxError:
    error = RateLimited(message)
    error.retry_after = retry_after  # type: ignore[attr-defined]
    return error


def retryable(error: BaseException) -> bool:
    return bool(getattr(error, "retryable", False)) or isinstance(error, RateLimited | SandboxUnreachable)


def capability(name: str) -> sandbox.Capability | None:
    """The capability named ``name`` (e.g. "terminal"), or None while the core has no such member."""
    try:
        return sandbox.Capability(name)
    except ValueError:
        return None


PAUSED: sandbox.SandboxState = getattr(sandbox.SandboxState, "PAUSED", sandbox.SandboxState.STOPPED)
