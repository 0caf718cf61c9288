"""Modules loaded on first use, for code on the CLI's hot path (one ``exec`` per process): a module
only some operations need (the store for a checkpoint, the egress proxy for network "proxy") costs
its import only when one of them runs. Import the real module under ``TYPE_CHECKING`` beside it, so
type checkers see it as it is.

A stand-in, not an entry in ``sys.modules``: until an attribute is read, the module is not imported
at all (``importlib.util.LazyLoader`` would itself cost an import of importlib.util on that path)."""

from __future__ import annotations

import sys
from types import ModuleType


class _Deferred(ModuleType):
    """Stands for module ``__name__``: imports it at the first attribute read, then reads through."""

    def __getattr__(self, attribute: str) -> object:
        name = self.__name__
        module = sys.modules.get(name)
        if module is None or getattr(module.__spec__, "_initializing", False):
            # absent, or another thread is running its code right now: the import waits for that
            # thread's import to end (reading through at once met a half-made module when threads
            # destroyed sandboxes together: "partially initialized module ... has no attribute")
            __import__(name)
            module = sys.modules[name]
        return getattr(module, attribute)


def lazy_module(name: str) -> ModuleType:
    """``name``, imported now in name only: its code runs at the first attribute access."""
    return sys.modules.get(name) or _Deferred(name)
