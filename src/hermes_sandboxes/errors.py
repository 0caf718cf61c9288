"""One exception hierarchy for the whole package, by cause: a caller catches what it can act on.

::

    SandboxError                    every error raised on purpose; ``retryable``: may work if tried again
    ├── InvalidInput                a malformed name, setting or argument; nothing was changed
    ├── SandboxNotFound             no such sandbox (or it was destroyed)
    ├── SandboxExists               the name is taken where a new sandbox was required
    │   └── SpecMismatch            open() found it made with another spec than the one asked for
    ├── CheckpointNotFound          no such checkpoint in that sandbox
    ├── CheckpointFailed            the automatic checkpoint before a risky command failed; it did not run
    ├── Unsupported                 the backend cannot do this (see ``Backend.capabilities``)
    ├── BackendUnavailable          the backend cannot run on this machine
    │   └── MissingDependency       its optional dependencies are not installed (names the pip extra)
    ├── AuthenticationFailed        the service refused our credentials
    ├── RateLimited                 the service asked us to slow down (retryable, ``retry_after``)
    ├── SandboxUnreachable          the sandbox or its service cannot be reached now (retryable)
    ├── QuotaExceeded               an account quota or a service limit was reached
    ├── SandboxBusy                 another process holds the sandbox's lock too long
    ├── ExecFailed                  a command could not start, or its connection was lost
    └── SandboxFileNotFound         no such path inside the sandbox (also a FileNotFoundError)

Every message says what failed, for which sandbox, and what to do next, so a CLI can print it as a
single line and an agent can act on it; none carries a secret.
"""

from __future__ import annotations


class SandboxError(Exception):
    """Root of every error this package raises on purpose. ``retryable`` tells a caller whether
    the same call may succeed if tried again later (a lost connection, a rate limit)."""

    retryable = False


class InvalidInput(SandboxError):
    """A name, setting or argument is malformed; nothing was changed."""


class SandboxNotFound(SandboxError):
    """The named sandbox does not exist (or was destroyed)."""


class SandboxExists(SandboxError):
    """A sandbox with that name already exists where a new one was required."""


class SpecMismatch(SandboxExists):
    """``Backend.open`` found the sandbox, made with another spec than the one asked for."""


class CheckpointNotFound(SandboxError):
    """The named checkpoint does not exist in that sandbox. ``sandbox`` names it when known, so that
    each face can add how its user lists the checkpoints (the CLI's command, an agent's tool)."""

    def __init__(self, message: str, *, sandbox: str | None = None) -> None:
        super().__init__(message)
        self.sandbox = sandbox


class Unsupported(SandboxError):
    """The backend cannot do this (see Backend.capabilities)."""


class BackendUnavailable(SandboxError):
    """The backend cannot run on this machine; the message names what is missing."""


class MissingDependency(BackendUnavailable):
    """The backend's optional dependencies are not installed; the message names the pip extra."""


class AuthenticationFailed(SandboxError):
    """The service refused our credentials (missing, wrong or expired token)."""


class RateLimited(SandboxError):
    """The service asked us to slow down; ``retry_after`` is its hint in seconds, if it gave one."""

    retryable = True

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class SandboxUnreachable(SandboxError):
    """The sandbox or its service cannot be reached now (lost connection, 5xx); try again."""

    retryable = True


class QuotaExceeded(SandboxError):
    """An account quota or a limit of the service was reached (sandboxes, disk, concurrency)."""


class SandboxBusy(SandboxError):
    """Another process holds the sandbox's lock for longer than we were willing to wait."""


class ExecFailed(SandboxError):
    """The command could not be started or its connection to the sandbox was lost."""


class SandboxFileNotFound(SandboxError, FileNotFoundError):
    """A path asked for inside the sandbox does not exist there."""


class CheckpointFailed(SandboxError):
    """The automatic checkpoint before a risky command could not be taken; the command did not run."""
