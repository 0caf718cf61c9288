"""The E2B backend: the contract mapped onto E2B's control plane and each sandbox's envd, through the
official SDK (the only module that imports it).

What it guarantees, and how:

* Identity lives in E2B, not on this host: a sandbox carries ``hermes_plugin: e2b-terminal`` and
  ``hermes_scope: <digest>`` in its metadata, the digest covering (profile, name, template,
  persistent, internet access, secure) exactly as the existing E2B plugin computes it, so either finds
  the other's sandboxes. A changed template or security posture therefore gives a new sandbox. A
  sandbox whose create reply was lost is found by that digest (at once, and on the next run); when
  several match, the newest is adopted and a warning gives the count.
* Persistent sandboxes are created with on-timeout pause (filesystem only, no auto-resume) and are
  never paused or killed behind the caller's back; ephemeral ones with on-timeout kill, and
  ``destroy()`` kills them.
* Before every command the lease is known to cover max(lease, timeout + grace): a lower bound of
  its end is kept from the last extension, and only when it falls short is the lease extended
  (before the command, with a headroom on top) with the class-level ``Sandbox.connect``
  (extend-only; it also resumes a paused sandbox). ``set_timeout``, which can shorten a lease
  another process relies on, is never called.
* Output reaches the sinks chunk by chunk; the SDK handle runs with ``retain_output=False`` so
  nothing accumulates on the host. A timeout or an interrupt kills the command by pid; the sandbox
  and its other processes survive.
* ``stop()`` pauses. Checkpoints are E2B snapshots named after the sandbox's identity; ``restore``
  replaces the sandbox with one created from the snapshot, with the same identity metadata.
* Errors come out as the package's cause classes; the API key is never part of any message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hermes_sandboxes.backends import BuildContext
    from hermes_sandboxes.backends.e2b.backend import E2BBackend
    from hermes_sandboxes.backends.e2b.settings import E2BSettings

__all__ = ["E2BBackend", "E2BProcess", "E2BSandbox", "build_backend", "lifecycle", "scope_digest"]

# Names resolve lazily so that ``backends.e2b.settings`` (the registry's settings model) imports without the SDK.
_WHERE = {
    "E2BBackend": "backend",
    "E2BProcess": "process",
    "E2BSandbox": "sandbox",
    "lifecycle": "identity",
    "scope_digest": "identity",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(name)
    from importlib import import_module

    return getattr(import_module(f"hermes_sandboxes.backends.e2b.{_WHERE[name]}"), name)


def build_backend(settings: E2BSettings, context: BuildContext | None = None) -> E2BBackend:
    """The registry's factory: the backend for ``settings``, keyed from ``E2B_API_KEY`` (read through
    the context's secret lookup, default this process's environment), its sandboxes those of the
    context's profile (default: the Hermes home this process would use)."""
    from hermes_sandboxes.backends.e2b.backend import E2BBackend
    from hermes_sandboxes.backends.e2b.identity import API_KEY_ENV

    lookup = context.secret_lookup if context else None
    return E2BBackend(settings, api_key=(lookup(API_KEY_ENV) or "") if lookup is not None else None,
                      profile=context.profile if context else None)
