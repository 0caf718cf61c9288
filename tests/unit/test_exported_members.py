"""The public face: what ``hermes_sandboxes`` exports is declared (``__all__``), pinned here, each
name importable from the package, and importing the package imports none of it (the local
sandbox's init imports the package). Also: every public method of the contract and of the recorder
says what it promises, and the error tree drawn in ``errors``' docstring is the real one."""

from __future__ import annotations

import inspect
import subprocess
import sys

import hermes_sandboxes
from hermes_sandboxes import errors
from hermes_sandboxes.recorder.command import RecordedProcess
from hermes_sandboxes.recorder.sandbox import RecordedSandbox
from hermes_sandboxes.sandbox import Backend, Process, Sandbox

PUBLIC = [
    "AuthenticationFailed", "Backend", "BackendEntry", "BackendUnavailable", "BuildContext", "Capability",
    "ChangeKind", "Checkpoint", "CheckpointFailed", "CheckpointNotFound", "Checkpointing", "Command",
    "Credentials", "DoctorCheck", "ExecFailed", "ExecResult", "FileChange", "Health", "Hooks", "HostState",
    "InvalidInput", "Limits", "MissingDependency", "Process", "QuotaExceeded", "RateLimited", "RecordedExec",
    "RecordedProcess", "RecordedSandbox", "RestorePreview", "Retention", "Sandbox", "SandboxBusy", "SandboxError",
    "SandboxExists", "SandboxFileNotFound", "SandboxInfo", "SandboxNotFound", "SandboxSpec", "SandboxState",
    "SandboxUnreachable", "SpecMismatch", "StoriedCheckpoint", "Unsupported", "__version__", "backends", "record",
]


def test_the_public_api_is_pinned() -> None:
    assert hermes_sandboxes.__all__ == PUBLIC  # a change here is a change of the public API: on purpose


def test_every_exported_name_is_importable_from_the_package() -> None:
    for name in hermes_sandboxes.__all__:
        value = getattr(hermes_sandboxes, name)
        assert value is not None, name
        if inspect.isclass(value) or inspect.isfunction(value):
            assert value.__module__.startswith("hermes_sandboxes"), name


def test_importing_the_package_imports_none_of_it() -> None:
    code = ("import sys, hermes_sandboxes; "
            "print(sorted(m for m in sys.modules if m.startswith('hermes_sandboxes.')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def _public_methods(cls: type) -> list[str]:
    names = []
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        function = member.fget if isinstance(member, property) else member
        if callable(function) or isinstance(member, property):
            names.append(name)
    return names


def test_every_public_method_of_the_contract_and_the_recorder_has_a_docstring() -> None:
    undocumented = [f"{cls.__name__}.{name}" for cls in (Sandbox, Backend, Process, RecordedSandbox, RecordedProcess)
                    for name in _public_methods(cls)
                    if not inspect.getdoc(getattr(cls, name))]
    assert undocumented == []


def test_the_error_tree_in_the_docstring_is_the_real_one() -> None:
    drawn: dict[str, str] = {}  # class -> its parent, as drawn
    parents: list[str] = []
    doc = errors.__doc__ or ""
    for line in doc.splitlines():
        words = line.replace("│", " ").replace("├──", "   ").replace("└──", "   ").split()
        if not words or not words[0].isidentifier() or not hasattr(errors, words[0]):
            continue
        depth = (len(line) - len(line.lstrip(" │├└─"))) // 4
        del parents[depth - 1:]
        if parents:
            drawn[words[0]] = parents[-1]
        parents.append(words[0])
    real = {name: cls.__mro__[1].__name__ for name, cls in vars(errors).items()
            if inspect.isclass(cls) and issubclass(cls, errors.SandboxError) and cls is not errors.SandboxError}
    assert drawn == real
