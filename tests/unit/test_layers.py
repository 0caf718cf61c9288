"""The package's architecture, checked from its imports (every import statement, also the ones
inside functions and under ``TYPE_CHECKING``): no import cycle between packages, no upward import,
and neither the Hermes plugin nor the MCP server reaching into a backend's modules (they build
backends through the registry).

The layers, lowest first (a module may import its own layer and those below it):

0. ``errors``: the exception tree every layer raises, importing nothing of ours;
1. ``util``: no domain knowledge (values, lazy imports, units, capture, flock);
2. the contract: ``sandbox``, ``settings``, ``names``, ``allowlist`` (the allow-list grammar that
   the settings, the recorder and every backend parse);
3. ``recorder``, ``risk``, ``egress``: journaled sandboxes, which commands are risky, the proxy;
4. ``backends``: the registry and the backends;
5. the faces: ``cli``, ``hermes``, ``mcp`` (and the package's own ``__init__``, the public face).

(``errors`` sits below ``util`` because ``util`` raises our errors: a unit that does not parse is
an InvalidInput like any other bad input.)
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import hermes_sandboxes

SRC = Path(hermes_sandboxes.__file__).parent
LAYERS: dict[str, int] = {
    "errors": 0, "util": 1, "sandbox": 2, "settings": 2, "names": 2, "allowlist": 2,
    "recorder": 3, "risk": 3, "egress": 3, "backends": 4, "ui": 4, "cli": 5, "hermes": 5, "mcp": 5, "__init__": 5,
}
# the faces that reach backends only through the registry (the CLI's ``store`` commands are the local
# backend's own: they may take it as what it is)
REGISTRY_ONLY = ("hermes", "mcp")


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str) -> bool:
    return (SRC / f"{name}.py").exists() or (SRC / name / "__init__.py").exists()


def _imports() -> list[tuple[str, str]]:
    """(importing module, imported module) for every import of one of ours."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        module = _module_of(path)
        package = module if path.name != "__init__.py" else module + ".__init__"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative (ruff's TID252 bans them; resolve it all the same)
                    base = package.split(".")[: -node.level]
                    names = [".".join([*base, *([node.module] if node.module else [])])]
                else:
                    names = [node.module or ""]
                if names[0] == "hermes_sandboxes":  # from hermes_sandboxes import x: x may be a module
                    names = [f"hermes_sandboxes.{alias.name}" if _is_module(alias.name) else "hermes_sandboxes"
                             for alias in node.names]
            else:
                continue
            found += [(module, name) for name in names if name.split(".")[0] == "hermes_sandboxes"]
    return found


def _part(module: str) -> str:
    """The top-level package (or contract module) ``module`` belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_package_has_a_layer() -> None:
    parts = {_part(_module_of(p)) for p in SRC.rglob("*.py")}
    assert parts - set(LAYERS) == set(), "a new package: give it a layer here (and say why)"


def test_no_module_imports_a_higher_layer() -> None:
    upward = [f"{src} imports {dst}" for src, dst in _imports()
              if LAYERS[_part(dst)] > LAYERS[_part(src)]]
    assert upward == []


def test_no_import_cycle_between_packages() -> None:
    edges: dict[str, set[str]] = defaultdict(set)
    for src, dst in _imports():
        if _part(src) != _part(dst):
            edges[_part(src)].add(_part(dst))

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in edges[start]:
            if nxt == goal:
                return True
            if nxt not in seen:
                seen.add(nxt)
                if reaches(nxt, goal, seen):
                    return True
        return False

    cycles = sorted(f"{a} -> {b} -> ... -> {a}" for a in list(edges) for b in edges[a] if reaches(b, a, {b}))
    assert cycles == []


def test_no_hermes_plugin_nor_mcp_module_imports_a_backend_module() -> None:
    """They reach backends through the registry (``hermes_sandboxes.backends``) only: what a
    backend needs from a face goes in ``backends.BuildContext``."""
    reaching = [f"{src} imports {dst}" for src, dst in _imports()
                if _part(src) in REGISTRY_ONLY and dst.startswith("hermes_sandboxes.backends.")]
    assert reaching == []


def test_the_checker_sees_imports_inside_functions() -> None:
    """The recorder imports the allow-list grammar inside a method: the walk must find it."""
    assert ("hermes_sandboxes.recorder.sandbox", "hermes_sandboxes.allowlist") in _imports()


def test_no_module_imports_another_modules_private_names() -> None:
    """A name another module needs is public there; what is private to a package lives in an
    underscore module with public names (``risk/_scan.py``), never as ``_name`` imported across."""
    private = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hermes_sandboxes"):
                private += [f"{_module_of(path)}: from {node.module} import {alias.name}" for alias in node.names
                            if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert private == []
