"""``df``, LAST USED and ``gc --unused-for``: what the store and each sandbox take, checked against
``du``, ``btrfs filesystem du``, ``df`` and the bytes the test wrote; unused sandboxes removed only
when someone confirmed."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from hermes_sandboxes.backends.local import LocalBackend, LocalSandbox
from hermes_sandboxes.backends.local.store.base import BtrfsStore
from hermes_sandboxes.recorder.state import HostState
from tests.cli.cli_kit import box, hs, ok  # noqa: F401 - box is a fixture

MB = 1_000_000


def _du(path: Path) -> int:
    return int(subprocess.run(["du", "-sB1", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])


def _near(ours: int, theirs: int, what: str) -> None:
    assert abs(ours - theirs) <= 0.05 * max(theirs, 1), f"{what}: ours {ours}, theirs {theirs}"


def test_df_matches_du_btrfs_and_what_was_written(local_backend: LocalBackend, box: LocalSandbox) -> None:  # noqa: F811
    home = local_backend.home
    assert box.exec("head -c 20000000 /dev/urandom > /root/big && head -c 3000000 /dev/urandom > /root/small"
                    ).exit_code == 0
    ok(home, "checkpoint", "create", box.name, "-m", "one")
    assert box.exec("rm /root/big && head -c 5000000 /dev/urandom > /root/new").exit_code == 0
    ok(home, "checkpoint", "create", box.name, "-m", "two")
    data = json.loads(ok(home, "df", "--json").stdout)
    (mine,) = [s for s in data["sandboxes"] if s["name"] == box.name]
    store = local_backend.store
    _near(mine["layer_bytes"], _du(store.layer(box.name) / "upper"), "layer vs du")
    ids = store.checkpoint_ids(box.name)
    assert mine["checkpoint_count"] == len(ids) == 2
    _near(mine["checkpoint_bytes"], sum(_du(store.checkpoint_path(box.name, c) / "upper") for c in ids),
          "checkpoints vs du")
    listing = subprocess.run(["btrfs", "filesystem", "du", "-s", "--raw", str(store.sandbox_dir(box.name))],
                             capture_output=True, text=True, check=True).stdout.splitlines()[-1].split()
    _near(mine["exclusive_bytes"], int(listing[1]) + int(listing[2]), "exclusive vs btrfs filesystem du")
    _near(mine["exclusive_bytes"], 28 * MB, "exclusive vs the bytes written (big, small, new)")
    used = subprocess.run(["df", "-B1", "--output=used", str(store.root)], capture_output=True, text=True,
                          check=True).stdout.split()[-1]
    _near(data["used_bytes"], int(used), "store vs df")
    assert isinstance(store, BtrfsStore)
    assert data["host_bytes"] == os.stat(store.image).st_blocks * 512
    table = ok(home, "df").stdout
    assert box.name in table and "EXCLUSIVE" in table and "LAST USED" in table


def test_ls_shows_last_used_and_gc_unused_for_needs_a_yes(local_backend: LocalBackend, box: LocalSandbox) -> None:  # noqa: F811
    home = local_backend.home
    ok(home, "exec", box.name, "--", "true")  # journals it
    assert "LAST USED" in ok(home, "ls").stdout
    journal = HostState().journal_path(local_backend.key, box.name)
    old = time.time() - 20 * 86400
    os.utime(journal, (old, old))  # as if nothing had used it for 20 days
    assert "20 d" in ok(home, "ls").stdout or "20d" in ok(home, "ls").stdout
    refused = hs(home, "gc", "--unused-for", "14d")  # stdin is not a terminal here
    assert refused.exit_code == 2 and "add --yes" in refused.output, refused.output
    assert box.name in refused.output and box.name in local_backend.names()
    assert box.name not in ok(home, "gc", "--unused-for", "30d").output  # not unused that long
    done = ok(home, "gc", "--unused-for", "14d", "--yes")
    assert f"destroyed {box.name}" in done.output
    assert box.name not in local_backend.names()
