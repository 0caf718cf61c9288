"""Process-wide state of the plugin: one backend per store, one sync lock per sandbox.

Hermes creates one environment object per task key and may create several for the same sandbox (the
``instance`` scope, or a delegate child after its parent's environment was reaped). They share the
backend object and serialise file sync on the sandbox through the lock kept here.
"""

from __future__ import annotations

import threading
from pathlib import Path

from hermes_sandboxes.sandbox import Backend


class Runtime:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._backends: dict[Path, Backend] = {}
        self._sync_locks: dict[str, threading.Lock] = {}

    def local_backend(self, home: Path) -> Backend:
        """The local backend on the store at ``home`` (imported lazily: it needs Linux and root)."""
        key = home.absolute()
        with self._lock:
            backend = self._backends.get(key)
            if backend is None:
                from hermes_sandboxes.backends.local import LocalBackend

                backend = LocalBackend(home)
                self._backends[key] = backend
            return backend

    def sync_lock(self, backend: Backend, name: str) -> threading.Lock:
        key = f"{backend.name}/{id(backend)}/{name}"
        with self._lock:
            return self._sync_locks.setdefault(key, threading.Lock())

    def forget(self, home: Path) -> None:
        """Drop the cached backend on ``home`` (tests that tear a store down)."""
        with self._lock:
            self._backends.pop(home.absolute(), None)


RUNTIME = Runtime()
