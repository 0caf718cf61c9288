"""The sandbox-side modules (``backends/local/guest/``) import only the standard library and each other.

Their interpreter runs inside every sandbox, so what they import is paid in start-up time and idle
memory by each one; the host side (stores, cgroups, the backend) must never creep in.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import hermes_sandboxes.backends.local.guest as guest

GUEST = Path(guest.__file__).parent
ALLOWED_PACKAGES = ("hermes_sandboxes.backends.local.guest",)


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative import"
            names.append(node.module or "")
    return names


def test_guest_modules_import_only_the_standard_library_and_the_guest_package() -> None:
    modules = sorted(GUEST.glob("*.py"))
    assert len(modules) >= 9, modules  # the walk found the package
    offenders = []
    for path in modules:
        for name in _imports(path):
            top = name.split(".")[0]
            if name.startswith(ALLOWED_PACKAGES) or top in sys.stdlib_module_names:
                continue
            offenders.append(f"{path.name}: {name}")
    assert offenders == []


def test_the_check_sees_a_host_import() -> None:
    # the test above would pass on an empty walk; show that it recognises a forbidden import
    tree = "from hermes_sandboxes.backends.local.store import base\n"
    name = next(n.module for n in ast.walk(ast.parse(tree)) if isinstance(n, ast.ImportFrom))
    assert name is not None and not name.startswith(ALLOWED_PACKAGES)
    assert name.split(".")[0] not in sys.stdlib_module_names
