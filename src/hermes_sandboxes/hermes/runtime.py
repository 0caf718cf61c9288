"""Process-wide state of the plugins: one backend per settings, one sync lock per sandbox, the host
state directory.

Hermes creates one environment object per task key and may create several for the same sandbox (the
``instance`` scope, or a delegate child after its parent's environment was reaped). They share the
backend object (and its connections) and serialise file sync on the sandbox through the lock here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from hermes_sandboxes.hermes.sync import restores
from hermes_sandboxes.hermes.sync.leases import WriterLease
from hermes_sandboxes.recorder.state import HostState
from hermes_sandboxes.sandbox import Backend
from hermes_sandboxes.settings import BackendSettings


class Runtime:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._backends: dict[str, Backend] = {}
        self._sync_locks: dict[str, threading.Lock] = {}

    @property
    def state(self) -> HostState:
        """Where journals go: read from the environment each time (HERMES_SANDBOXES_STATE)."""
        return HostState()

    def backend(self, settings: BackendSettings, make: Callable[[BackendSettings], Backend],
                identity: str = "") -> Backend:
        """The backend those settings (and ``identity``: whose credentials) describe, built once per
        process by ``make`` (its module, with its SDK, is imported only then)."""
        key = f"{identity}\0{settings.model_dump_json()}"
        with self._lock:
            backend = self._backends.get(key)
            if backend is None:
                backend = make(settings)
                self._backends[key] = backend
            return backend

    def sync_lock(self, backend: Backend, name: str) -> threading.Lock:
        key = f"{backend.key}/{name}"
        with self._lock:
            return self._sync_locks.setdefault(key, threading.Lock())

    def writer_lease(self, backend: Backend, name: str) -> WriterLease:
        """This process's view of the sandbox's writer lease (one per environment: each holds its
        own lock file description, so environments of one process contend like processes do)."""
        return restores.writer_lease(self.state.root, backend.key, name)

    def forget(self) -> None:
        """Drop the cached backends (tests that tear a store down, or switch state directories)."""
        with self._lock:
            self._backends.clear()


RUNTIME = Runtime()
