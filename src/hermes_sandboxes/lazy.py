"""Modules loaded on first use, for code on the CLI's hot path (one ``exec`` per process): a module
only some operations need (the store for a checkpoint, the egress proxy for network "proxy") costs
its import only when one of them runs. Import the real module under ``TYPE_CHECKING`` beside it, so
type checkers see it as it is."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType


def lazy_module(name: str) -> ModuleType:
    """``name``, imported now in name only: its code runs at the first attribute access."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ImportError(f"no module named {name!r}")
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module
