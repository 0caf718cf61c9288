"""A store home or state directory that another local user controls is refused (issue 24, finding 8).

The attacker is a real local user (``hs-sec-*``, made by tests/rootless/kit.create_user for the test
and removed after, even when it fails): they make the directory root is about to use, with a ``store.tmp`` linked to a
root-owned file, which root then truncated to 64 GiB and formatted as the store image.
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
from hermes_sandboxes.errors import InvalidInput, SandboxError
from hermes_sandboxes.recorder.state import HostState
from tests.conftest import teardown_backend
from tests.local.kit import fresh_name
from tests.rootless import kit

SCRIPT = Path(sys.executable).parent / "hermes-sandboxes"


@pytest.fixture
def attacker() -> Iterator[str]:
    name = f"hs-sec-{os.getpid()}"  # (the whole pid: another copy of the suite runs its own)
    kit.remove_user(name)  # a run killed before its teardown, with this pid
    try:
        kit.create_user(name)  # useradd again while another copy's useradd or userdel holds the lock
        yield name
    finally:
        kit.remove_user(name)
        assert subprocess.run(["id", name], capture_output=True).returncode != 0, f"user {name} still there"


def as_user(user: str, script: str) -> None:
    subprocess.run(["sh", "-c", script], user=user, group=user, check=True, cwd="/", capture_output=True)


@pytest.fixture
def victim() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="hs-sec-victim-", dir="/srv"))
    directory.chmod(0o755)
    target = directory / "precious"
    target.write_text("root's own file\n")
    target.chmod(0o644)
    try:
        yield target
    finally:
        shutil.rmtree(directory)


@pytest.fixture
def parent() -> Iterator[Path]:
    """A directory like /tmp (sticky, writable by all) where the attacker prepares the trap."""
    directory = Path(tempfile.mkdtemp(prefix="hs-sec-", dir="/tmp"))
    directory.chmod(0o1777)
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory / "home" / "mnt")], check=False, capture_output=True)
        shutil.rmtree(directory)


def test_a_store_home_made_by_another_user_is_refused_and_nothing_of_root_s_is_touched(
        attacker: str, victim: Path, parent: Path) -> None:
    home = parent / "home"
    as_user(attacker, f"mkdir {home} && ln -s {victim} {home}/store.tmp")
    backend: LocalBackend | None = None
    try:
        with pytest.raises((InvalidInput, SandboxError), match="owned by uid"):
            backend = LocalBackend(home, store="btrfs")
            backend.create(fresh_name())
    finally:
        if backend is not None:
            teardown_backend(backend)
    assert victim.read_text() == "root's own file\n" and victim.stat().st_size == 16


def test_a_store_home_others_can_write_is_refused(parent: Path) -> None:
    home = parent / "open-home"
    home.mkdir()
    home.chmod(0o777)
    with pytest.raises(InvalidInput, match="writable by its group or others"):
        LocalBackend(home, store="copy")


def test_a_state_directory_made_by_another_user_is_refused(attacker: str, parent: Path) -> None:
    state = parent / "state"
    as_user(attacker, f"mkdir -m 755 {state}")
    with pytest.raises(SandboxError, match="owned by uid"):
        HostState(state).trusted()
    backend = LocalBackend(parent / "home", store="copy")
    backend.store  # noqa: B018 - made by root, a copy store: the CLI below finds it so
    try:
        made = subprocess.run([str(SCRIPT), "--home", str(backend.home), "create", fresh_name()],
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "HERMES_SANDBOXES_STATE": str(state)})
        assert made.returncode != 0 and "owned by uid" in made.stderr, (made.returncode, made.stderr)
        assert list(state.iterdir()) == []  # no journal written into it
    finally:
        teardown_backend(backend)


def test_a_state_directory_under_one_others_can_replace_is_refused(attacker: str, parent: Path) -> None:
    """Under a directory the attacker owns, even a state directory root made itself can be swapped."""
    theirs = parent / "theirs"
    as_user(attacker, f"mkdir -m 755 {theirs}")
    with pytest.raises(SandboxError, match="owned by uid"):
        HostState(theirs / "state").trusted()
    assert not (theirs / "state").exists()
