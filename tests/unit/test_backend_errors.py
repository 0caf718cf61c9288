"""The local backend refuses clearly where it cannot work, and never runs anything on the host."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hermes_sandboxes.backends.local import LocalBackend
from hermes_sandboxes.errors import InvalidInput


def test_a_user_without_a_base_gets_a_clear_error_and_nothing_runs(tmp_path: Path) -> None:
    """A normal user runs rootless sandboxes, which need a base root filesystem of that user's own."""
    marker = tmp_path / "ran-on-host"
    home = tmp_path / "home"
    tmp_path.chmod(0o777)
    script = (
        "from hermes_sandboxes.backends.local import LocalBackend\n"
        "from hermes_sandboxes.errors import BackendUnavailable\n"
        f"b = LocalBackend({str(home)!r})\n"
        "try:\n"
        f"    b.create('x').exec('touch {marker}')\n"
        "except BackendUnavailable as exc:\n"
        "    print('refused:', exc)\n"
    )
    proc = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", script],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "refused:" in proc.stdout
    assert "needs a base root filesystem you own" in proc.stdout
    assert not marker.exists()


@pytest.mark.parametrize("home", ["/tmp/with space", "/tmp/a,b", "/tmp/a:b", "/tmp/" + "x" * 90])
def test_a_home_path_that_cannot_work_is_refused_up_front(home: str) -> None:
    with pytest.raises(InvalidInput):
        LocalBackend(home)


def test_an_unknown_store_kind_is_refused() -> None:
    with pytest.raises(InvalidInput):
        LocalBackend("/tmp/hs-x", store="zfs")  # type: ignore[arg-type]
