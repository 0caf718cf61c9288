"""The rootless base's tarball for the tests, built once per machine under build/rootless-base/.

``scripts/setup.sh test`` builds it (``python -m tests.store_rootless.base_cache``); the tests' fixture
builds it too when it is missing, so a run never skips for want of it. Unpacking it (what a user's
first sandbox does after mmdebstrap) is each test's own, as the test user.
"""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path

from hermes_sandboxes.backends.local.store import baseimage

CACHE = Path(__file__).resolve().parents[2] / "build" / "rootless-base"


def cached_tarball() -> Path:
    """The tarball, built once: copies of the suite (or of setup.sh) that start together wait for
    the first one's build (a lock next to it) instead of each fetching its own."""
    target = CACHE / f"{baseimage.name()}.tar"
    if not target.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        with open(CACHE / "build.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not target.exists():  # (built by another process meanwhile)
                print(f"building the rootless base's tarball for the tests: {target}", file=sys.stderr)
                baseimage.build_tarball(target, lambda line: print(line, file=sys.stderr, flush=True))
    os.chmod(target, 0o644)  # the test user unpacks it
    return target


if __name__ == "__main__":
    print(cached_tarball())
