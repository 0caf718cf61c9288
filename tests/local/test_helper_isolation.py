"""Helper processes run as host root and must import only this package and the interpreter's own
modules, never a file from the caller's working directory or module path (issue 24, finding 2).

The attack: Python modules named like ones the helpers import (``ipaddress``, ``secrets``, ``json``
and more) planted in the directory where ``hermes-sandboxes`` is run (a project's own
``secrets.py``, or a file an agent wrote into a shared checkout), and a ``lib/python3.X/os.py``
there, which an interpreter started with a bare name as argv[0] (the fork server) takes for its
standard library. Each planted module only leaves a marker file when imported. The real console script then
creates a proxy sandbox and runs commands in it, through the warm exec server and without it, which
starts every helper: the warm server, the fork server and its launcher, the egress proxy.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermes_sandboxes.backends.local import LocalBackend
from tests.local.kit import fresh_name

SCRIPT = Path(sys.executable).parent / "hermes-sandboxes"
# modules the proxy, the fork server, the launcher, the init and the warm server import
PLANTED = ("ipaddress", "secrets", "json", "socket", "ssl", "marshal", "struct", "selectors", "threading",
           "sitecustomize", "usercustomize", "typing", "dataclasses", "base64", "hashlib", "tempfile")


@pytest.fixture
def planted() -> Iterator[tuple[Path, Path]]:
    """A directory of planted modules and the (empty) directory their markers would go to."""
    root = Path(tempfile.mkdtemp(prefix="hs-sec-plant-", dir="/srv"))
    markers = root / "markers"
    markers.mkdir()
    trap = root / "cwd"
    trap.mkdir()
    stdlib = trap / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    stdlib.mkdir(parents=True)
    for name in PLANTED:
        for directory in (trap, stdlib):
            (directory / f"{name}.py").write_text(
                f"open({str(markers / name)!r}, 'a').write(str(__import__('os').getpid()) + '\\n')\n"
                "raise ImportError('planted module')\n")
    (stdlib / "os.py").write_text(f"open({str(markers / 'os')!r}, 'a').write('stdlib\\n')\n")
    try:
        yield trap, markers
    finally:
        shutil.rmtree(root)


@pytest.mark.parametrize("warm", ["1", "0"])
def test_helpers_never_import_from_the_caller_s_directory_or_module_path(
        local_backend: LocalBackend, planted: tuple[Path, Path], warm: str) -> None:
    trap, markers = planted
    home, name = str(local_backend.home), fresh_name()
    env = {**os.environ, "HERMES_SANDBOXES_WARM": warm}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(SCRIPT), "--home", home, *args], cwd=trap, env=env, capture_output=True,
                              text=True, timeout=180, check=False)

    try:
        made = cli("create", name, "--network", "proxy")  # allowed nowhere: the proxy answers 403
        assert made.returncode == 0, made.stderr
        for _ in range(3):  # a warm server starts on the first call, serves the next ones
            ran = cli("exec", name, "--", "curl -s -m 5 -o /dev/null -w '%{http_code}' http://127.0.0.1:9/")
            imported = sorted(p.name for p in markers.iterdir())
            assert (ran.returncode, ran.stdout, imported) == (0, "403", []), ran.stderr  # the proxy answered
        assert cli("stop", name).returncode == 0
        again = cli("exec", name, "--", "true")  # a fresh start: fork server, launcher, init, proxy
        assert again.returncode == 0, again.stderr
    finally:
        cli("rm", "--yes", name)
    assert sorted(p.name for p in markers.iterdir()) == []
