"""The store's life through the CLI: creates that fail or are killed midway leave nothing or a
"broken" sandbox that rm removes. Each test drives the real ``hermes-sandboxes`` in a subprocess;
failures are real ones (capabilities dropped with setpriv, signals at pause points of the code).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from hermes_sandboxes.backends.local import LocalBackend
from tests.local.kit import fresh_name, wait_for

CLI = [sys.executable, "-m", "hermes_sandboxes.cli"]
NO_SYS_ADMIN = ["setpriv", "--inh-caps=-sys_admin", "--bounding-set=-sys_admin"]


def cli(home: Path, *args: str, prefix: tuple[str, ...] = (), **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*prefix, *CLI, "--home", str(home), *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **env}, check=False)


def listing(home: Path) -> dict[str, str]:
    done = cli(home, "ls", "--json")
    assert done.returncode == 0, done.stderr
    return {s["name"]: s["state"] for s in json.loads(done.stdout)}


def paused(home: Path, point: str, *args: str) -> subprocess.Popen[str]:
    """The CLI running ``args``, stopped at the store's test pause ``point`` (see store.test_pause)."""
    marker = Path(tempfile.mkdtemp(prefix="hsl-pause-")) / "paused"
    env = {**os.environ, "HERMES_SANDBOXES_TEST_PAUSE": point, "HERMES_SANDBOXES_TEST_PAUSE_MARKER": str(marker)}
    child = subprocess.Popen([*CLI, "--home", str(home), *args], env=env, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (marker.exists() and bool(marker.read_text().strip())) or child.poll() is not None,
                 f"the CLI to pause at {point}", 120)
        assert child.poll() is None, f"ended before {point}: {child.communicate()[1]}"
    finally:
        marker.unlink(missing_ok=True)
        marker.parent.rmdir()
    return child


# -- a create that fails or is killed ------------------------------------------------------------


def test_a_create_without_cap_sys_admin_changes_nothing_and_doctor_names_the_cause(
        local_backend: LocalBackend) -> None:
    home, name = local_backend.home, fresh_name()
    before = listing(home)
    done = cli(home, "create", name, prefix=tuple(NO_SYS_ADMIN))
    assert done.returncode == 1 and "CAP_SYS_ADMIN" in done.stderr, done.stderr
    assert listing(home) == before
    assert not local_backend.store.sandbox_dir(name).exists()  # no half-made layer either
    doctor = cli(home, "doctor", "--json", prefix=tuple(NO_SYS_ADMIN))
    assert doctor.returncode == 1
    report: dict[str, Any] = json.loads(doctor.stdout)
    assert report["usable"] is False and "CAP_SYS_ADMIN" in report["problem"]
    assert cli(home, "doctor").returncode == 0  # with every capability: usable again


@pytest.mark.parametrize("point", ["create-layer", "create-masked"])
def test_a_create_killed_midway_is_listed_as_broken_and_rm_removes_it(local_backend: LocalBackend,
                                                                      point: str) -> None:
    home, name = local_backend.home, fresh_name()
    child = paused(home, point, "create", name)
    assert listing(home).get(name) is None  # still being created: not listed, not broken
    child.kill()  # SIGKILL: no clean-up of ours runs
    child.communicate()
    assert listing(home)[name] == "broken"
    refused = cli(home, "exec", name, "--", "true")
    assert refused.returncode == 125 and f"hermes-sandboxes rm {name}" in refused.stderr, refused.stderr
    assert cli(home, "rm", name, "--yes").returncode == 0
    assert name not in listing(home)
    assert not local_backend.store.sandbox_dir(name).exists()
    assert cli(home, "create", name).returncode == 0  # the name is free again
    assert listing(home)[name] == "stopped"
    assert cli(home, "rm", name, "--yes").returncode == 0


def test_a_create_stopped_by_sigterm_midway_removes_what_it_made(local_backend: LocalBackend) -> None:
    home, name = local_backend.home, fresh_name()
    before = listing(home)
    child = paused(home, "create-masked", "create", name)
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=120)
    assert child.returncode == 143, err
    assert listing(home) == before
    assert not local_backend.store.sandbox_dir(name).exists()
