"""SDK and transport failures as the package's cause classes, with the API key redacted."""

from __future__ import annotations

import e2b
import httpx
from connectrpc.errors import ConnectError

from hermes_sandboxes.backends.e2b.identity import API_KEY_ENV
from hermes_sandboxes.errors import (
    BackendUnavailable,
    ExecFailed,
    InvalidInput,
    SandboxError,
    SandboxFileNotFound,
    SandboxNotFound,
)
from hermes_sandboxes.secrets import Redactor


def transient(exc: BaseException) -> bool:
    """A lost connection, a timeout or a server-side failure: worth retrying, and the request may
    have taken effect (a create whose reply was lost)."""
    status = getattr(exc, "status_code", None)
    return (isinstance(exc, (e2b.TimeoutException, e2b.ServiceBusyException, httpx.TransportError,
                             ConnectError, OSError))
            or (isinstance(status, int) and status >= 500))


def map_error(exc: BaseException, what: str, redactor: Redactor) -> SandboxError:
    """An SDK or transport failure as one of our cause classes, its message redacted."""
    from hermes_sandboxes import errors

    detail = redactor.redact(str(exc).strip() or type(exc).__name__)
    message = f"E2B: {what} failed: {detail}"
    cls: type[SandboxError]
    if isinstance(exc, e2b.FileNotFoundException):
        return SandboxFileNotFound(message)
    if isinstance(exc, e2b.AuthenticationException):
        cls = getattr(errors, "AuthenticationFailed", BackendUnavailable)
        return cls(f"{message}. Check {API_KEY_ENV}.")
    if isinstance(exc, e2b.RateLimitException):
        cls = getattr(errors, "RateLimited", ExecFailed)
        return cls(message)
    if isinstance(exc, e2b.NotEnoughSpaceException):
        cls = getattr(errors, "QuotaExceeded", ExecFailed)
        return cls(message)
    if isinstance(exc, (e2b.SandboxNotFoundException, e2b.NotFoundException)):
        return SandboxNotFound(message)
    if isinstance(exc, e2b.InvalidArgumentException):
        return InvalidInput(message)
    status = getattr(exc, "status_code", None)
    if transient(exc):
        cls = getattr(errors, "SandboxUnreachable", ExecFailed)
        return cls(f"{message}; retry, the sandbox may be busy or the connection was lost")
    if isinstance(status, int) and status in (402, 403):
        cls = getattr(errors, "QuotaExceeded", ExecFailed)
        return cls(message)
    return ExecFailed(message)
