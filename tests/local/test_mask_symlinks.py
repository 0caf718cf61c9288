"""Masks hide what a path points to, not only the symlink (issue 24, finding 3), tried from inside.

Everything lives under /srv (on the root filesystem, masked by nothing): a brokered credential's
``file=`` through a symlinked directory and through a symlinked file, a configured mask that is a
symlink, a copy-store home reached through a symlink (one sandbox reading another's layer), and a
mask that loops, which must be refused before anything starts.

Run rootless too, by tests/rootless's user (ROOTLESS): there the tree is in the user's base (what a
rootless sandbox sees; commands inside name it by kit.inside), the credential files and the store
home, host paths, are in the user's home and /tmp, which a rootless sandbox never sees.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermes_sandboxes.backends.local import LocalBackend
from hermes_sandboxes.egress.broker import BrokeredCredential
from hermes_sandboxes.errors import InvalidInput
from tests.conftest import teardown_backend
from tests.local.kit import ROOTLESS, inside, new_sandbox, register_home, sh, temp_backend, temp_home, visible_dir

SECRET = "hsb-mask-secret-" + os.urandom(8).hex()


@pytest.fixture
def tree() -> Iterator[Path]:
    root = visible_dir("sec-mask")
    try:
        yield root
    finally:
        shutil.rmtree(root)


def test_a_credential_file_and_a_mask_behind_symlinks_are_hidden_where_they_point(tree: Path) -> None:
    creds = Path(tempfile.mkdtemp(prefix="hs-sec-cred-", dir=Path.home())) if ROOTLESS else tree
    try:
        (creds / "real").mkdir()
        (creds / "real" / "token").write_text(SECRET + "\n")
        (creds / "real" / "token2").write_text(SECRET + "\n")
        (creds / "link").symlink_to(creds / "real")  # a symlinked directory on the way to the file
        (creds / "token-link").symlink_to("real/token2")  # the file itself a (relative) symlink
        (tree / "private").mkdir()
        (tree / "private" / "notes").write_text(SECRET + "\n")
        (tree / "mask-link").symlink_to(inside(tree / "private"))  # absolute, as the sandbox resolves it
        credentials = [BrokeredCredential(name="A_TOKEN", file=str(creds / "link" / "token"), hosts=("127.0.0.1:9",)),
                       BrokeredCredential(name="B_TOKEN", file=str(creds / "token-link"), hosts=("127.0.0.1:9",))]
        seen_tree = inside(tree)
        with temp_backend(store="copy", credentials=credentials, masks=[f"{seen_tree}/mask-link"]) as backend, \
                new_sandbox(backend) as sb:
            seen = sb.exec(f"cat {creds}/real/token {creds}/real/token2 {creds}/link/token {creds}/token-link "
                           f"{seen_tree}/private/notes {seen_tree}/mask-link/notes; ls -A {seen_tree}/private").stdout
            assert SECRET not in seen, seen
            assert sh(sb, f"ls -A {seen_tree}").stdout.split()  # the tree itself is still there, only those hidden
    finally:
        if creds != tree:
            shutil.rmtree(creds)


def test_a_copy_store_home_reached_through_a_symlink_hides_its_sandboxes_from_each_other(tree: Path) -> None:
    parent = temp_home() if ROOTLESS else tree  # rootless: a store is never in the base the sandbox sees
    real = parent / "home-real"
    real.mkdir(mode=0o700)
    home = parent / "home"
    home.symlink_to(real)
    register_home(real)
    backend = LocalBackend(home, store="copy")
    try:
        with new_sandbox(backend) as a, new_sandbox(backend) as b:
            sh(a, f"echo {SECRET} > /root/a-secret")
            seen = b.exec(f"grep -rs {SECRET} {real} {home}/ ; ls -A {real}").stdout
            assert SECRET not in seen and seen.strip() == "", seen
    finally:
        teardown_backend(backend)
        if parent != tree:
            shutil.rmtree(parent)


def test_a_mask_that_cannot_be_resolved_safely_is_refused(tree: Path) -> None:
    (tree / "loop-a").symlink_to(inside(tree / "loop-b"))
    (tree / "loop-b").symlink_to(inside(tree / "loop-a"))
    (tree / "up").symlink_to("/")
    for mask in (tree / "loop-a" / "x", tree / "up"):  # a loop; a mask that would hide the whole root
        with pytest.raises(InvalidInput, match="cannot be resolved safely"):
            LocalBackend("/tmp/hsl-never-made", masks=[inside(mask)])
    assert not Path("/tmp/hsl-never-made").exists()
