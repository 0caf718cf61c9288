"""Change a virtualenv without disturbing what runs from it: copy it beside itself, run the install
in the copy, and exchange the two directories in one rename (renameat2 RENAME_EXCHANGE), so that a
CLI started from the venv at any moment finds either the old set of packages or the new one, never
pip's half-replaced files (a pydantic-core of one version under a pydantic of another).

    python3 scripts/venv_swap.py .venv -- {venv}/bin/python -m pip install -e '.[test]'

``{venv}`` in the command is the copy's path. Paths the venv writes into itself (console scripts'
``#!`` lines, the activate scripts) are turned back to the venv's own name before the exchange. On
failure the venv is left as it was and the copy removed. Standard library only.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

AT_FDCWD = -100
RENAME_EXCHANGE = 2


def exchange(a: Path, b: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"renameat2 exchange of {a} and {b}: {os.strerror(errno)}")


def retarget(venv: Path, staging: Path) -> None:
    """Point what the install wrote with the copy's path back at the venv's own."""
    old, new = os.fsencode(staging.resolve()), os.fsencode(venv.resolve())
    for path in (staging / "bin").iterdir():
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        if old in data[:4096] and b"\0" not in data[:4096]:  # a script (text), not a binary
            path.write_bytes(data.replace(old, new))


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    venv = Path(argv[0])
    staging = venv.with_name(venv.name + ".next")
    shutil.rmtree(staging, ignore_errors=True)  # a previous run's, interrupted
    subprocess.run(["cp", "-a", "--reflink=auto", str(venv), str(staging)], check=True)
    command = [arg.replace("{venv}", str(staging)) for arg in argv[2:]]
    try:
        done = subprocess.run(command, check=False)
        if done.returncode != 0:
            return done.returncode
        retarget(venv, staging)
        exchange(staging, venv)  # the venv is the new one from here; the copy holds the old
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
