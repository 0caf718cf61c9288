"""Run the fake Sprites API as a process of its own (benchmarks measure the client's memory apart):

    python -m tests.fakes.sprites [--token T]

Prints one JSON line ``{"url": ..., "token": ..., "home": <its store>}`` once it serves; stops, destroying every Sprite
and its throw-away local store, when its stdin closes. ``GET /_fake/requests`` (same token) lists
what it recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from hermes_sandboxes.backends.local import LocalBackend
from tests.conftest import teardown_backend
from tests.fakes.sprites.server import FakeSprites


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--token", default="fake-token")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="hsf-", dir="/tmp"))
    backend = LocalBackend(home, image_size="8G")
    fake = FakeSprites(backend, token=args.token, local_prefix=f"fsp{os.getpid()}")
    try:
        fake.start()
        print(json.dumps({"url": fake.url, "token": fake.token, "home": str(home)}), flush=True)
        sys.stdin.read()
    finally:
        fake.stop()
        teardown_backend(backend)
    return 0


if __name__ == "__main__":
    sys.exit(main())
