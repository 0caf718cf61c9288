"""The backend registry: a name (``local``, ``sprites``, ``e2b``) -> its settings model and factory.

Each backend's settings model lives in a light module (no SDK import) and carries the backend's
name as the literal value of its ``backend`` field, the discriminator of the settings union. The
factory module, with its SDK, is imported only when that backend is chosen; a missing optional
dependency is one ``MissingDependency`` naming the pip extra. The faces (CLI, Hermes plugin, demo)
reach backends only through here, never by importing a backend module.

A face hands the factory what only it knows, as one ``BuildContext``: where secrets are read (a
Hermes profile's secret store rather than this process's environment), the agent profile the
sandboxes belong to, and where the host keeps the audit log (its state directory). So no face
imports a backend module to pass them.

Third-party backends: ``register()`` adds one at run time (as the conformance suite's degraded test
backends do), and an installed distribution can declare one in the entry-point group
``hermes_sandboxes.backends`` (the object it names: a ``BackendEntry``, or a callable returning
one); those are found the first time a name is not registered, or when ``names()`` is asked.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Mapping

from hermes_sandboxes.errors import InvalidInput, MissingDependency
from hermes_sandboxes.util.values import dataclass

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the hot path of a CLI exec)
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

    from hermes_sandboxes.sandbox import Backend
    from hermes_sandboxes.settings import BackendSettings

DEFAULT_BACKEND = "local"
ENTRY_POINT_GROUP = "hermes_sandboxes.backends"


@dataclass(frozen=True)
class BuildContext:
    """What a face passes a backend's factory besides the settings (all optional).

    ``secret_lookup(name)``: a secret's value or None (default: this process's environment), for
    the cloud backends' tokens and the local backend's brokered credentials. ``profile``: the agent
    profile (its home) whose sandboxes these are, where a backend keys its sandboxes by it (E2B).
    ``audit_path(backend_key)``: the audit log a backend's own host processes append to (the local
    egress proxy), default the host state's under ``$HERMES_SANDBOXES_STATE``."""

    secret_lookup: Callable[[str], str | None] | None = None
    profile: str | None = None
    audit_path: Callable[[str], Path] | None = None


@dataclass(frozen=True)
class BackendEntry:
    name: str
    summary: str
    settings: str  # "module:Class" of its settings model (imports no SDK)
    factory: str  # "module:function": settings -> Backend (imported only when chosen)
    extra: str | None = None  # the pip extra that installs its dependencies
    requires: tuple[str, ...] = ()  # top-level modules the factory needs
    # "module:function": validated settings values (the model's JSON dump) -> Backend, importing no
    # settings model; lets the CLI's fast path build the backend from its settings cache
    from_values: str | None = None
    # whether the factories take a BuildContext as their second argument (a third-party backend
    # written before it existed takes the settings alone)
    takes_context: bool = False

    def missing(self) -> list[str]:
        if not self.requires:  # (the local backend: its CLI exec need not import importlib.util)
            return []
        import importlib.util

        return [m for m in self.requires if importlib.util.find_spec(m) is None]


_LOCK = threading.Lock()
_ENTRIES: dict[str, BackendEntry] = {}
_discovered = False


def register(entry: BackendEntry) -> None:
    """Add (or replace) backend ``entry.name``."""
    with _LOCK:
        _ENTRIES[entry.name] = entry


def discover() -> list[str]:
    """Register the backends installed distributions declare in the ``hermes_sandboxes.backends``
    entry-point group (again, when called again); the names found. A declaration that cannot be
    loaded is skipped with a warning: one broken plugin must not take the others down."""
    global _discovered
    from importlib.metadata import entry_points

    found = []
    for point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = point.load()
            made = loaded if isinstance(loaded, BackendEntry) else loaded()
            if not isinstance(made, BackendEntry):
                raise TypeError(f"{point.value} is not a BackendEntry")
        except Exception as exc:
            import logging

            logging.getLogger(__name__).warning("backend plugin %s (%s) cannot be loaded: %s",
                                                point.name, point.value, exc)
            continue
        register(made)
        found.append(made.name)
    _discovered = True
    return found


register(BackendEntry(
    "local", "namespaces, an overlay root and a copy-on-write store on this machine (Linux, root)",
    "hermes_sandboxes.backends.local.settings:LocalSettings",
    "hermes_sandboxes.backends.local.factory:build_backend",
    from_values="hermes_sandboxes.backends.local.factory:from_values", takes_context=True))
register(BackendEntry(
    "sprites", "Fly.io Sprites: persistent cloud VMs with checkpoints",
    "hermes_sandboxes.backends.sprites.settings:SpritesSettings",
    "hermes_sandboxes.backends.sprites:build_backend", extra="sprites", requires=("sprites",),
    takes_context=True))
register(BackendEntry(
    "e2b", "E2B cloud sandboxes (pause and resume, snapshots)",
    "hermes_sandboxes.backends.e2b.settings:E2BSettings",
    "hermes_sandboxes.backends.e2b:build_backend", extra="e2b", requires=("e2b",), takes_context=True))


def names() -> list[str]:
    """Every backend's name: the built-in ones, the registered ones and the declared ones."""
    if not _discovered:
        discover()
    with _LOCK:
        return list(_ENTRIES)


def entry(name: str) -> BackendEntry:
    """Backend ``name``'s entry (looked for among the declared ones when not registered);
    InvalidInput naming the known backends when there is none."""
    with _LOCK:
        found = _ENTRIES.get(name)
    if found is None and not _discovered:
        discover()
        with _LOCK:
            found = _ENTRIES.get(name)
    if found is None:
        raise InvalidInput(f"unknown backend {name!r}; known backends: {', '.join(names())}")
    return found


def _load(path: str, what: str) -> Any:
    module, _, attr = path.partition(":")
    try:
        __import__(module)  # importlib.import_module, without importing importlib on the CLI's hot path
        return getattr(sys.modules[module], attr)
    except (ImportError, AttributeError) as exc:
        raise MissingDependency(f"{what} is not available in this installation ({exc})") from exc


def settings_model(name: str) -> type[BackendSettings]:
    """The settings model of backend ``name`` (cheap: no SDK is imported)."""
    found = entry(name)
    model: type[BackendSettings] = _load(found.settings, f"the {name} backend's settings")
    return model


def missing_dependency(name: str) -> str | None:
    """One line saying what to install when backend ``name`` lacks its optional dependencies."""
    found = entry(name)
    missing = found.missing()
    if not missing:
        return None
    # the package is installed from a checkout or a wheel built from one, not from an index
    extra = (f"install the package's [{found.extra}] extra, e.g. pip install -e '/path/to/checkout[{found.extra}]'"
             if found.extra else f"install {', '.join(missing)}")
    return f"the {name} backend needs {', '.join(missing)}, which is not installed: {extra}"


def build(settings: BackendSettings, name: str | None = None, *, context: BuildContext | None = None) -> Backend:
    """Backend ``name`` (default: the one ``settings.backend`` names) with those settings and what
    the face passes in ``context``. InvalidInput for an unknown name; MissingDependency naming the
    pip extra when its optional dependencies are not installed."""
    name = name or str(getattr(settings, "backend", ""))
    problem = missing_dependency(name)
    if problem is not None:
        raise MissingDependency(problem)
    found = entry(name)
    factory: Callable[..., Backend] = _load(found.factory, f"the {name} backend")
    return factory(settings, context or BuildContext()) if found.takes_context else factory(settings)


def build_from_values(name: str, values: Mapping[str, Any], *, context: BuildContext | None = None) -> Backend | None:
    """Backend ``name`` from settings values validated earlier (see ``BackendEntry.from_values``);
    None when the backend offers no such way, or not for these values (the caller validates and
    uses ``build``)."""
    found = entry(name)
    if found.from_values is None or found.missing():
        return None
    factory: Callable[..., Backend | None] = _load(found.from_values, f"the {name} backend")
    return factory(values, context or BuildContext()) if found.takes_context else factory(values)


def validate(name: str, raw: Mapping[str, Any] | None, *, where: str) -> BackendSettings:
    """Backend ``name``'s settings from ``raw`` (InvalidSettings naming the key when invalid)."""
    from hermes_sandboxes.settings import validate_settings

    return validate_settings(settings_model(name), raw, where=where)
