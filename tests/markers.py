"""The suite's markers, given by where a test lives and what it needs, in one place.

- ``root``: runs real sandboxes (namespaces, mounts, cgroups, loop devices): everything but the pure
  unit tests and the packaging checks needs a root shell.
- ``qemu``: boots the cgroup v2 guest under software emulation (``tests/guest``).
- ``fake_cloud``: drives the real Sprites or E2B SDK against the loopback fakes (``tests/fakes``).
- ``clients``: runs real agent clients (Codex CLI, Claude Code) against the scripted model server.
- ``slow``: one of the slowest tests (listed in ``SLOW``, measured on the development machine with
  ``pytest --durations``), so that ``pytest -m "not qemu and not slow"`` is a quick loop.

Every marker is registered (``pyproject.toml``) and the suite runs with ``--strict-markers``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
NO_ROOT = {"unit"}  # directories whose tests never make a sandbox
NO_ROOT_FILES = {"docs/test_packaging.py", "local/test_guest_imports.py"}
BY_DIRECTORY = {"guest": ("qemu",), "sprites": ("fake_cloud",), "e2b": ("fake_cloud",), "remote": ("fake_cloud",)}
CLOUD_PARAMETERS = ("[sprites", "[e2b", "-sprites]", "-e2b]", "sprites-", "e2b-")

# Test files (or single tests, as node ids) that take long: measured, the slowest first.
SLOW: tuple[str, ...] = (
    "store_rootless/test_rootless_store.py::test_the_rootless_base_is_the_sandboxes_own",  # ~55 s: unpacks 270 MB
)


def marks_for(item: pytest.Item) -> list[str]:
    rel = Path(str(item.path)).resolve().relative_to(TESTS).as_posix()
    top = rel.split("/", 1)[0]
    marks = list(BY_DIRECTORY.get(top, ()))
    if top not in NO_ROOT and rel not in NO_ROOT_FILES:
        marks.append("root")
    if any(p in item.name for p in CLOUD_PARAMETERS) and "fake_cloud" not in marks:
        marks.append("fake_cloud")
    node = f"{rel}::{item.name}"
    if any(rel == s or node == s or node.startswith(s + "[") for s in SLOW):
        marks.append("slow")
    return marks


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for name in marks_for(item):
            item.add_marker(name)
