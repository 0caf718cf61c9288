"""The command line of a helper Python process that imports nothing it was not meant to.

Helpers (the egress proxy, the hiding helper) run as host root, started from whatever directory
the caller happens to be in. A plain ``python -c`` puts that directory first on the module path,
and inherits ``PYTHONPATH`` and the user's site directory: a ``secrets.py`` or ``ipaddress.py``
lying there would run as root. So a helper runs isolated (``-I``: no current directory, no
``PYTHON*`` variables, no user site; ``-S``: no site-packages processing) from ``/``, with a module
path of the standard library plus, named explicitly, the directories this package and the
third-party packages the helper needs were found in by the caller.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Sequence

CWD = "/"  # where every helper starts: a directory nobody can plant modules in
_PACKAGE = "hermes_sandboxes"


def module_path(packages: Sequence[str]) -> list[str]:
    """The sys.path entries ``packages`` (top-level names; this package always) are imported from."""
    entries: list[str] = []
    for name in (_PACKAGE, *packages):
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin in (None, "built-in", "frozen"):
            continue  # not installed (the helper says so when it needs it), or part of the interpreter
        location = os.path.dirname(spec.origin)
        if spec.submodule_search_locations:  # a package: the entry is its parent directory
            location = os.path.dirname(location)
        if location not in entries:
            entries.append(location)
    return entries


def python_argv(code: str, *args: str, packages: Sequence[str] = ()) -> list[str]:
    """argv running ``code`` in an isolated interpreter (this one's executable) that can import this
    package and ``packages``; ``args`` follow as sys.argv[1:]."""
    # after the standard library: an installed package never shadows one of its modules
    boot = f"import sys; sys.path += {module_path(packages)!r}; del sys\n{code}"
    return [sys.executable, "-I", "-S", "-c", boot, *args]
