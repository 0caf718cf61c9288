"""Shared fixtures: a real local backend on a throw-away store, cleaned up even when tests fail."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermes_sandboxes.backends.local import LocalBackend
from hermes_sandboxes.backends.local.store.base import BtrfsStore, remove_tree
from hermes_sandboxes.errors import SandboxError
from hermes_sandboxes.names import unique_name
from tests.cli import warm_kit
from tests.markers import pytest_collection_modifyitems  # noqa: F401  (the suite's markers, see there)

ROOT_REASON = ("the local sandbox's tests run as root (CI and development machines of this project do); "
               "tests/rootless runs the rootless ones as a user it makes, with ROOTLESS_ENV set")
ROOTLESS_ENV = "HERMES_SANDBOXES_TEST_ROOTLESS"  # set by tests/rootless for the suites it runs as its user


def _require_root() -> None:
    if os.geteuid() != 0 and os.environ.get(ROOTLESS_ENV) != "1":
        pytest.fail(ROOT_REASON)  # a skip would hide that the suite did not test the sandbox


def make_backend(home: Path, **kwargs: object) -> LocalBackend:
    return LocalBackend(home, **kwargs)  # type: ignore[arg-type]


def teardown_backend(backend: LocalBackend) -> None:
    """Destroy every sandbox, unmount the store (which frees its loop device), remove the home."""
    errors: list[str] = []
    for name in backend.names():
        try:
            backend.get(name).destroy()
        except Exception as exc:  # keep cleaning up; report at the end
            errors.append(f"{name}: {exc}")
    store = backend._store
    if isinstance(store, BtrfsStore):
        try:
            store.unmount()
        except Exception as exc:
            errors.append(f"unmount: {exc}")
            subprocess.run(["umount", "-l", str(store.mountpoint)], check=False)
    # rm -rf (any depth): an old layer a restore left in .trash may be nested thousands deep, and
    # its sweeper may be removing it meanwhile (then a second pass finds what the race left)
    for _attempt in (1, 2):
        with contextlib.suppress(SandboxError):
            remove_tree(backend.home)
            break
    assert not errors, f"cleanup failed: {errors}"


@pytest.fixture(scope="session", autouse=True)
def host_state_dir() -> Iterator[Path]:
    """The host state (journals, audit logs) and the CLI's config file of this run live in a
    throw-away directory, never in the developer's own ~/.local/state or ~/.config."""
    root = Path(tempfile.mkdtemp(prefix="hstate-", dir="/tmp"))
    root.chmod(0o755)  # tests that drop to an unprivileged user still find "no config file here"
    saved = {k: os.environ.get(k) for k in ("HERMES_SANDBOXES_STATE", "HERMES_SANDBOXES_CONFIG",
                                            "HERMES_SANDBOXES_BACKEND")}
    os.environ["HERMES_SANDBOXES_STATE"] = str(root / "state")
    (root / "config.toml").write_text("# empty: the defaults apply\n")  # (a named file must exist)
    os.environ["HERMES_SANDBOXES_CONFIG"] = str(root / "config.toml")
    os.environ.pop("HERMES_SANDBOXES_BACKEND", None)
    yield root / "state"
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def warm_servers() -> Iterator[Path]:
    """The CLI processes of this run talk to warm exec servers of this run only (a throw-away
    runtime directory, never the developer's own), which idle out after a minute and are stopped
    when the session ends, by the pids they recorded."""
    root = Path(tempfile.mkdtemp(prefix="hwarm-", dir="/tmp"))  # 0700, as a runtime directory is
    saved = {k: os.environ.get(k) for k in ("XDG_RUNTIME_DIR", "HERMES_SANDBOXES_WARM_IDLE_S",
                                            "HERMES_SANDBOXES_WARM")}
    os.environ["XDG_RUNTIME_DIR"] = str(root)
    os.environ["HERMES_SANDBOXES_WARM_IDLE_S"] = "60"
    os.environ.pop("HERMES_SANDBOXES_WARM", None)
    try:
        yield root / "hermes-sandboxes"
    finally:
        warm_kit.stop_all(root / "hermes-sandboxes")
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def store_home() -> Iterator[Path]:
    _require_root()
    home = Path(tempfile.mkdtemp(prefix="hst-", dir="/tmp"))
    yield home
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def local_backend(store_home: Path) -> Iterator[LocalBackend]:
    backend = make_backend(store_home, image_size="16G")
    yield backend
    teardown_backend(backend)


@pytest.fixture
def sandbox(local_backend: LocalBackend) -> Iterator[object]:
    sb = local_backend.create(unique_name("t"))
    try:
        yield sb
    finally:
        sb.destroy()
