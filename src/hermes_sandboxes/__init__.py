"""hermes-sandboxes: sandboxes for an AI agent's shell commands.

The public API, importable from here (``from hermes_sandboxes import RecordedSandbox``); ``__all__``
lists it and tests/unit/test_exported_members.py pins it:

- the contract (``sandbox``): ``Backend``, ``Sandbox``, ``Process``, ``Capability``, the value types;
- the errors (``errors``): ``SandboxError`` and its tree;
- the backends (``backends``): ``build``, ``validate``, ``register``, ``BackendEntry``, ``BuildContext``;
- the recorder (``recorder``): ``RecordedSandbox`` and what it returns, its options, ``HostState``,
  and ``record(sandbox)``, the way to wrap a sandbox that the CLI and the Hermes plugin use too (its
  restores are noted for Hermes sessions running on the sandbox on this host).

Kept import-light on purpose: the local sandbox's init process imports this package and its memory
footprint counts against every idle sandbox, so every name is imported only when first asked for
(a module ``__getattr__``), never by ``import hermes_sandboxes`` itself.
"""

from __future__ import annotations

__version__ = "0.1.0"

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see util/values.py)
if TYPE_CHECKING:  # what type checkers see; at run time each name is imported on first use
    from typing import Any

    from hermes_sandboxes import backends
    from hermes_sandboxes.backends import BackendEntry, BuildContext
    from hermes_sandboxes.errors import (
        AuthenticationFailed,
        BackendUnavailable,
        CheckpointFailed,
        CheckpointNotFound,
        ExecFailed,
        InvalidInput,
        MissingDependency,
        QuotaExceeded,
        RateLimited,
        SandboxBusy,
        SandboxError,
        SandboxExists,
        SandboxFileNotFound,
        SandboxNotFound,
        SandboxUnreachable,
        SpecMismatch,
        Unsupported,
    )
    from hermes_sandboxes.recorder.command import RecordedProcess
    from hermes_sandboxes.recorder.options import Checkpointing, Credentials, Health, Hooks, Retention
    from hermes_sandboxes.recorder.sandbox import RecordedExec, RecordedSandbox, RestorePreview, StoriedCheckpoint
    from hermes_sandboxes.recorder.state import HostState
    from hermes_sandboxes.sandbox import (
        Backend,
        Capability,
        ChangeKind,
        Checkpoint,
        Command,
        DoctorCheck,
        ExecResult,
        FileChange,
        Limits,
        Process,
        Sandbox,
        SandboxInfo,
        SandboxSpec,
        SandboxState,
    )

# name -> the module that defines it
_WHERE = {
    **dict.fromkeys((
        "Backend", "Capability", "ChangeKind", "Checkpoint", "Command", "DoctorCheck", "ExecResult", "FileChange",
        "Limits", "Process", "Sandbox", "SandboxInfo", "SandboxSpec", "SandboxState",
    ), "hermes_sandboxes.sandbox"),
    **dict.fromkeys((
        "AuthenticationFailed", "BackendUnavailable", "CheckpointFailed", "CheckpointNotFound", "ExecFailed",
        "InvalidInput", "MissingDependency", "QuotaExceeded", "RateLimited", "SandboxBusy", "SandboxError",
        "SandboxExists", "SandboxFileNotFound", "SandboxNotFound", "SandboxUnreachable", "SpecMismatch", "Unsupported",
    ), "hermes_sandboxes.errors"),
    **dict.fromkeys(("BackendEntry", "BuildContext"), "hermes_sandboxes.backends"),
    **dict.fromkeys(("RecordedExec", "RecordedSandbox", "RestorePreview", "StoriedCheckpoint"),
                    "hermes_sandboxes.recorder.sandbox"),
    "RecordedProcess": "hermes_sandboxes.recorder.command",
    **dict.fromkeys(("Checkpointing", "Credentials", "Health", "Hooks", "Retention"),
                    "hermes_sandboxes.recorder.options"),
    "HostState": "hermes_sandboxes.recorder.state",
}
_MODULES = ("backends",)

__all__ = [
    "AuthenticationFailed", "Backend", "BackendEntry", "BackendUnavailable", "BuildContext", "Capability",
    "ChangeKind", "Checkpoint", "CheckpointFailed", "CheckpointNotFound", "Checkpointing", "Command", "Credentials",
    "DoctorCheck", "ExecFailed", "ExecResult", "FileChange", "Health", "Hooks", "HostState", "InvalidInput",
    "Limits", "MissingDependency", "Process", "QuotaExceeded", "RateLimited", "RecordedExec", "RecordedProcess",
    "RecordedSandbox", "RestorePreview", "Retention", "Sandbox", "SandboxBusy", "SandboxError", "SandboxExists",
    "SandboxFileNotFound", "SandboxInfo", "SandboxNotFound", "SandboxSpec", "SandboxState", "SandboxUnreachable",
    "SpecMismatch", "StoriedCheckpoint", "Unsupported", "__version__", "backends", "record",
]


def __getattr__(name: str) -> object:
    module = _WHERE.get(name)
    if module is None:
        if name in _MODULES:
            module, name = f"hermes_sandboxes.{name}", ""
        else:
            raise AttributeError(f"module 'hermes_sandboxes' has no attribute {name!r}")
    __import__(module)  # importlib.import_module, without importing importlib
    import sys

    value = sys.modules[module] if not name else getattr(sys.modules[module], name)
    globals()[name or module.rpartition(".")[2]] = value  # asked once: a plain attribute from then on
    return value


def __dir__() -> list[str]:
    return __all__


def record(sandbox: Sandbox, **options: Any) -> RecordedSandbox:
    """``sandbox`` wrapped in the recorder with its journal and audit log under the host state
    directory (``$HERMES_SANDBOXES_STATE``, see ``HostState``), as the CLI and the Hermes plugin wrap
    it: a restore through it is noted for Hermes sessions running on the sandbox on this host (each
    brings its ``~/.hermes`` up to date before its next command), and Hermes's own housekeeping
    commands are recorded as such. ``options`` go to ``RecordedSandbox`` (``checkpointing``,
    ``retention``, ``health``, ``credentials``, ``origin``; ``hooks`` replaces the Hermes ones)."""
    from hermes_sandboxes.hermes.sync import restores
    from hermes_sandboxes.recorder.state import HostState

    state = HostState()
    options.setdefault("hooks", restores.hooks(state.root))
    return state.recorded(sandbox, **options)
