"""The local sandbox backend: the embedded default, needing nothing but this machine's kernel."""

from hermes_sandboxes.backends.local.backend import LocalBackend, default_limits
from hermes_sandboxes.backends.local.sandbox import LocalSandbox

__all__ = ["LocalBackend", "LocalSandbox", "default_limits"]
