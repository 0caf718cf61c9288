"""The backend registry: a name (``local``, ``sprites``, ``e2b``) -> its settings model and factory.

Each backend's settings model lives in a light module (no SDK import) and carries the backend's
name as the literal value of its ``backend`` field, the discriminator of the settings union. The
factory module, with its SDK, is imported only when that backend is chosen; a missing optional
dependency is one ``MissingDependency`` naming the pip extra. The faces (CLI, Hermes plugin, demo)
reach backends only through here, never by importing a backend module.

``register()`` adds a backend at run time (a third-party one, or the degraded test backends of the
conformance suite).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Mapping

from hermes_sandboxes.errors import InvalidInput, MissingDependency
from hermes_sandboxes.util.values import dataclass

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the hot path of a CLI exec)
if TYPE_CHECKING:
    from typing import Any

    from hermes_sandboxes.sandbox import Backend
    from hermes_sandboxes.settings import BackendSettings

DEFAULT_BACKEND = "local"


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

    def missing(self) -> list[str]:
        if not self.requires:  # (the local backend: its CLI exec need not import importlib.util)
            return []
        import importlib.util

        return [m for m in self.requires if importlib.util.find_spec(m) is None]


_LOCK = threading.Lock()
_ENTRIES: dict[str, BackendEntry] = {}


def register(entry: BackendEntry) -> None:
    with _LOCK:
        _ENTRIES[entry.name] = entry


register(BackendEntry(
    "local", "namespaces, an overlay root and a copy-on-write store on this machine (Linux, root)",
    "hermes_sandboxes.backends.local.settings:LocalSettings",
    "hermes_sandboxes.backends.local.factory:build_backend",
    from_values="hermes_sandboxes.backends.local.factory:from_values"))
register(BackendEntry(
    "sprites", "Fly.io Sprites: persistent cloud VMs with checkpoints",
    "hermes_sandboxes.backends.sprites.settings:SpritesSettings",
    "hermes_sandboxes.backends.sprites:build_backend", extra="sprites", requires=("sprites",)))
register(BackendEntry(
    "e2b", "E2B cloud sandboxes (pause and resume, snapshots)",
    "hermes_sandboxes.backends.e2b.settings:E2BSettings",
    "hermes_sandboxes.backends.e2b:build_backend", extra="e2b", requires=("e2b",)))


def names() -> list[str]:
    with _LOCK:
        return list(_ENTRIES)


def entry(name: str) -> BackendEntry:
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


def build(settings: BackendSettings, name: str | None = None) -> Backend:
    """Backend ``name`` (default: the one ``settings.backend`` names) with those settings."""
    name = name or str(getattr(settings, "backend", ""))
    problem = missing_dependency(name)
    if problem is not None:
        raise MissingDependency(problem)
    factory: Callable[[BackendSettings], Backend] = _load(entry(name).factory, f"the {name} backend")
    return factory(settings)


def build_from_values(name: str, values: Mapping[str, Any]) -> Backend | None:
    """Backend ``name`` from settings values validated earlier (see ``BackendEntry.from_values``);
    None when the backend offers no such way, or not for these values (the caller validates and
    uses ``build``)."""
    found = entry(name)
    if found.from_values is None or found.missing():
        return None
    factory: Callable[[Mapping[str, Any]], Backend | None] = _load(found.from_values, f"the {name} backend")
    return factory(values)


def validate(name: str, raw: Mapping[str, Any] | None, *, where: str) -> BackendSettings:
    """Backend ``name``'s settings from ``raw`` (InvalidSettings naming the key when invalid)."""
    from hermes_sandboxes.settings import validate_settings

    return validate_settings(settings_model(name), raw, where=where)
