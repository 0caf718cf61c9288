"""Host-side walks of a sandbox's layer never leave it, however the sandbox moves things meanwhile.

The attack: inside, a directory and a symlink to a host directory swap places in a tight loop
(renameat2 RENAME_EXCHANGE), so a walk by path names that lists the directory and then descends
into it may find itself in the host's files (before the fix, a few diffs here listed them). Diffs
(and so restore previews) and layer sizes run here against that loop, on both kinds of store, and
must never show a host file.
"""

from __future__ import annotations

import os
import platform
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermes_sandboxes.backends.local import LocalSandbox
from hermes_sandboxes.backends.local.store.fdwalk import Tree
from tests.local.kit import wait_for

_RENAMEAT2 = {"x86_64": 316, "aarch64": 276}[platform.machine()]
SWAPPER = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
os.makedirs("/root/race/d/sub", exist_ok=True)
for i in range(20):
    open(f"/root/race/d/sub/f{i}", "w").write("inside")
for i in range(100):  # walked after d (made first), which leaves time for a swap in between
    os.makedirs(f"/root/race/s{i:03d}")
    for j in range(10):
        open(f"/root/race/s{i:03d}/f{j}", "w").write("inside")
os.symlink(sys.argv[1], "/root/race/l")
print("swapping", flush=True)
while True:
    libc.syscall(int(sys.argv[2]), -100, b"/root/race/d", -100, b"/root/race/l", 2)
"""
HOST_BYTES = 8 << 20


@pytest.fixture
def host_dir() -> Iterator[Path]:
    token = secrets.token_hex(6)
    path = Path(f"/tmp/hsl-race-{token}")
    (path / "sub").mkdir(parents=True)
    for i in range(20):
        (path / "sub" / f"host-secret-{token}-{i}").write_text("host")
        (path / f"host-secret-{token}-top{i}").write_text("host")
    with open(path / "sub" / f"host-secret-{token}-big", "wb") as f:
        f.write(b"\1" * HOST_BYTES)  # written, not sparse: a layer size that counted it would show it
    yield path
    shutil.rmtree(path)


def test_diff_and_layer_size_never_see_host_files_while_the_sandbox_swaps(sb: LocalSandbox, host_dir: Path) -> None:
    ck = sb.checkpoint("before the race")
    out = bytearray()
    swapper = sb.start(["python3", "-c", SWAPPER, str(host_dir), str(_RENAMEAT2)], on_stdout=out.extend)
    try:
        wait_for(lambda: b"swapping" in out, "the swapping loop to start")
        seen_inside = 0
        for _ in range(25):
            paths = [c.path for c in sb.diff(ck.id)]
            leaked = [p for p in paths if "host-secret" in p]
            assert not leaked, leaked
            seen_inside += any(p.startswith("/root/race/") and p.endswith("/f0") for p in paths)
            layer = sb.info().layer_bytes or 0
            assert layer < HOST_BYTES, f"layer size {layer} counts the host's file"
        assert seen_inside, "the diffs never saw the sandbox's own files: the race was not exercised"
    finally:
        swapper.kill()
        swapper.wait(30)


def test_a_tree_walk_does_not_follow_symlinks_anywhere(tmp_path: Path, host_dir: Path) -> None:
    root = tmp_path / "layer"
    (root / "d").mkdir(parents=True)
    (root / "d" / "own").write_text("own")
    os.symlink(host_dir, root / "link")
    os.symlink(host_dir, root / "d" / "link")
    with Tree(root) as tree:
        walked = sorted(path for path, _ in tree.walk())
        assert walked == ["d", "d/link", "d/own", "link"]
        assert tree.dir_fd("link") is None and tree.dir_fd("link/sub") is None
        assert tree.entries("d/link") is None
        assert tree.readlink("d/link") == str(host_dir)
        assert tree.readlink("link/sub") is None
