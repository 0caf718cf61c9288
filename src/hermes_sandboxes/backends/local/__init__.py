"""The local sandbox backend: the embedded default, needing nothing but this machine's kernel.

Names are resolved lazily: the sandbox's init process imports submodules of this package and must
not pay (in start-up time and resident memory) for the host-side backend it never uses.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs the init start-up time
if TYPE_CHECKING:
    from typing import Any

    from hermes_sandboxes.backends.local.backend import LocalBackend, default_limits
    from hermes_sandboxes.backends.local.sandbox import LocalSandbox

__all__ = ["LocalBackend", "LocalSandbox", "default_limits"]


def __getattr__(name: str) -> Any:
    if name in ("LocalBackend", "default_limits"):
        from hermes_sandboxes.backends.local import backend

        return getattr(backend, name)
    if name == "LocalSandbox":
        from hermes_sandboxes.backends.local import sandbox

        return sandbox.LocalSandbox
    raise AttributeError(name)
