"""The Sprites backend (Fly.io): the only place that imports the sprites-py SDK.

Importing this package needs the ``sprites`` extra (``pip install -e '/path/to/checkout[sprites]'``);
its settings model lives apart, in ``hermes_sandboxes.backends.sprites_settings``, without the SDK.
"""

from __future__ import annotations

from hermes_sandboxes.backends.sprites.backend import SpritesBackend, build_backend
from hermes_sandboxes.backends.sprites.sandbox import SpritesSandbox

__all__ = ["SpritesBackend", "SpritesSandbox", "build_backend"]
