"""A loopback Sprites API (REST, exec WebSocket, fs, checkpoints) backed by real local sandboxes."""

from tests.fakes.sprites.server import FakeSprites, Fault, Recorded

__all__ = ["FakeSprites", "Fault", "Recorded"]
