"""SDK and transport failures as the package's cause classes, with the API key redacted."""

from __future__ import annotations

import e2b
import httpx
from connectrpc.errors import ConnectError

from hermes_sandboxes.backends.e2b.identity import API_KEY_ENV
from hermes_sandboxes.errors import (
    AuthenticationFailed,
    ExecFailed,
    InvalidInput,
    QuotaExceeded,
    RateLimited,
    SandboxError,
    SandboxFileNotFound,
    SandboxNotFound,
    SandboxUnreachable,
)
from hermes_sandboxes.recorder.credentials import Redactor


def transient(exc: BaseException) -> bool:
    """A lost connection, a timeout or a server-side failure: worth retrying, and the request may
    have taken effect (a create whose reply was lost)."""
    status = getattr(exc, "status_code", None)
    return (isinstance(exc, (e2b.TimeoutException, e2b.ServiceBusyException, httpx.TransportError,
                             ConnectError, OSError))
            or (isinstance(status, int) and status >= 500))


def map_error(exc: BaseException, what: str, redactor: Redactor) -> SandboxError:
    """An SDK or transport failure as one of our cause classes, its message redacted."""
    detail = redactor.redact(str(exc).strip() or type(exc).__name__)
    message = f"E2B: {what} failed: {detail}"
    status = getattr(exc, "status_code", None)
    if isinstance(exc, e2b.FileNotFoundException):
        return SandboxFileNotFound(message)
    if isinstance(exc, e2b.AuthenticationException):
        return AuthenticationFailed(f"{message}. Check {API_KEY_ENV}.")
    if isinstance(exc, e2b.RateLimitException):
        return RateLimited(message)
    if isinstance(exc, e2b.NotEnoughSpaceException) or status in (402, 403):
        return QuotaExceeded(message)
    if isinstance(exc, (e2b.SandboxNotFoundException, e2b.NotFoundException)):
        return SandboxNotFound(message)
    if isinstance(exc, e2b.InvalidArgumentException) or status in (400, 422):
        return InvalidInput(message)
    if transient(exc):
        return SandboxUnreachable(f"{message}; retry, the sandbox may be busy or the connection was lost")
    return ExecFailed(message)
