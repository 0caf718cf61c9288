"""The Sprites backend (Fly.io): the only place that imports the sprites-py SDK.

Using the backend needs the ``sprites`` extra (``pip install -e '/path/to/checkout[sprites]'``); this
package and its settings model (``settings.py``) import without the SDK: the names here resolve lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hermes_sandboxes.backends import BuildContext
    from hermes_sandboxes.backends.sprites.backend import SpritesBackend
    from hermes_sandboxes.backends.sprites.settings import SpritesSettings

__all__ = ["SpritesBackend", "SpritesSandbox", "build_backend"]

_WHERE = {"SpritesBackend": "backend", "SpritesSandbox": "sandbox"}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(name)
    from importlib import import_module

    return getattr(import_module(f"hermes_sandboxes.backends.sprites.{_WHERE[name]}"), name)


def build_backend(settings: SpritesSettings, context: BuildContext | None = None) -> SpritesBackend:
    """The registry's factory: the backend for ``settings``, its token found through the context's
    secret lookup (``SPRITES_TOKEN``, then ``SPRITE_TOKEN``; default this process's environment)."""
    from hermes_sandboxes.backends.sprites.backend import build_backend as build

    return build(settings, context)
