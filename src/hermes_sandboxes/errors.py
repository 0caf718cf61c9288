"""One exception hierarchy for the whole package.

Every message says what failed, for which sandbox, and what to do next, so a CLI can print it as a
single line and an agent can act on it.
"""

from __future__ import annotations


class SandboxError(Exception):
    """Root of every error this package raises on purpose."""


class InvalidInput(SandboxError):
    """A name, setting or argument is malformed; nothing was changed."""


class SandboxNotFound(SandboxError):
    """The named sandbox does not exist (or was destroyed)."""


class SandboxExists(SandboxError):
    """A sandbox with that name already exists where a new one was required."""


class CheckpointNotFound(SandboxError):
    """The named checkpoint does not exist in that sandbox."""


class Unsupported(SandboxError):
    """The backend cannot do this (see Backend.capabilities)."""


class BackendUnavailable(SandboxError):
    """The backend cannot run on this machine; the message names what is missing."""


class SandboxBusy(SandboxError):
    """Another process holds the sandbox's lock for longer than we were willing to wait."""


class ExecFailed(SandboxError):
    """The command could not be started or its connection to the sandbox was lost."""


class SandboxFileNotFound(SandboxError, FileNotFoundError):
    """A path asked for inside the sandbox does not exist there."""
