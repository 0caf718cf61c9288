"""Rootless stores, as an ordinary user, on each filesystem this machine can give one: btrfs the user
owns (with and without user_subvol_rm_allowed), XFS with reflinks, ext4. Each test's scenario (kit.py)
makes real sandbox-side changes through a user-namespace overlay, then checkpoints, diffs, restores,
forks and deletes with the store, and removes everything; this side checks what it saw."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.store_rootless.harness import TestUser, user_filesystem

EXPECTED = {"btrfs": ("subvolume", True), "btrfs-rm": ("subvolume", True), "xfs": ("reflink", False),
            "ext4": ("overlay", False)}
C1: dict[str, Any] = {"etc/motd": ["changed motd\n", 0], "etc/added": ["added\n", 0], "opt/tool/new": ["new tool\n", 0],
      "var/apt-private/cache": ["apt's\n", 42], "var/apt-private/mine": ["mine\n", 42]}
SPECIAL = {"hardlinked": True, "link": "../motd", "fifo": True, "sparse": [64 << 20, True], "suid": "0o4755",
           "xattr": "kept"}
C1["special"] = SPECIAL
C2: dict[str, Any] = {"special": SPECIAL, "etc/added": ["added\nmore\n", 0], "opt/tool/new": ["new tool\n", 0],
      "var/apt-private/cache": ["apt's\n", 42], "var/apt-private/mine": ["mine\n", 42]}


@pytest.fixture(scope="module", params=list(EXPECTED))
def seen(request: pytest.FixtureRequest, test_user: TestUser) -> Any:
    with user_filesystem(request.param, test_user) as mountpoint:
        home = mountpoint / "home"
        home.mkdir()
        import os

        os.chown(home, test_user.uid, test_user.gid)
        yield request.param, test_user.run("store", str(home))


def test_the_kind_is_the_best_the_filesystem_gives(seen: Any) -> None:
    fs, result = seen
    kind, cheap = EXPECTED[fs]
    assert (result["kind"], result["cheap"]) == (kind, cheap)
    assert result["description"]
    if fs == "btrfs-rm":
        assert "one step" in result["description"]


def test_the_store_helper_holds_no_lock_of_its_parent(seen: Any) -> None:
    _, result = seen
    assert result["lock_released"] is True


def test_layers_belong_to_the_mapped_range(seen: Any, test_user: TestUser) -> None:
    _, result = seen
    assert result["layer_owner"] == test_user.uid  # inner root is the user
    assert result["checkpoint_owners"] == [0, 42]  # as the namespace sees them: root and _apt's id


def test_a_checkpoint_holds_only_what_changed(seen: Any) -> None:
    fs, result = seen
    assert 4 << 20 <= result["checkpoint_bytes"] < 5 << 20  # the layer's 4 MiB file; never the 8 MiB base file
    if fs == "ext4":  # a copy, of the changed files only
        assert 4 << 20 <= result["checkpoint_blocks"] < 6 << 20
    else:  # snapshots and reflinks share the data
        assert result["checkpoint_blocks"] < 2 << 20
    assert result["checkpoint_is_subvolume"] == fs.startswith("btrfs")


def test_diffs_see_whiteouts_opaque_dirs_and_inner_owners(seen: Any) -> None:
    _, result = seen
    # /opt/tool/old, hidden by the opaque /opt/tool, is not listed: treediff walks the layers only, in
    # root mode too (the opaque directory itself is read: its xattr is user.overlay.opaque here)
    listed = [tuple(c) for c in result["diff_c1_vs_base"] if not c[0].startswith("/etc/special")]
    assert sorted(listed) == sorted([
        ("/etc/added", "added"), ("/etc/gone", "deleted"), ("/etc/motd", "modified"),
        ("/opt/tool/new", "added"), ("/var/apt-private/mine", "added"), ("/srv/dense", "added")])
    assert sorted(map(tuple, result["diff_c1_vs_live"])) == sorted([
        ("/etc/added", "modified"), ("/etc/motd", "deleted"), ("/srv/new", "added")])
    assert result["diff_after_restore"] == []


def test_restore_and_fork_give_the_checkpoints_files(seen: Any) -> None:
    _, result = seen
    assert result["checkpoint_ids"] == ["c1", "c2"]
    assert result["view_live"] == C2
    assert result["view_restored_c1"] == C1
    assert result["view_fork_c2"] == C2
    assert result["view_a_after_fork_write"] == C1  # a fork's writes stay in the fork
    assert result["view_fork_live"] == C1
    assert result["after_delete"] == ["c2"]
    assert result["view_restored_c2"] == C2


def test_overlay_checkpoints_copy_only_what_changed_since_the_previous_one(seen: Any) -> None:
    """On ext4, the second checkpoint is a delta on the first: only the entries changed since
    (read through the chain, it is the whole layer); deleting the first folds it into the second;
    after a restore the layer is new and its next checkpoint full. Every other kind copies (or
    snapshots) whole."""
    fs, result = seen
    assert result["c1_is_the_layer"] and result["c2_is_the_layer"]  # every entry and attribute, links kept
    assert result["diff_c1_c2"] == result["diff_c1_vs_live"]
    assert result["c2_holds_changed"] is True
    assert result["c2_holds_unchanged"] is (fs != "ext4")
    assert result["c2_kind"] == ({"full": False, "parent": "c1"} if fs == "ext4" else {"full": True, "parent": None})
    assert result["c2_kind_after_delete"] == {"full": True, "parent": None}
    assert result["c3_kind"] == {"full": True, "parent": None}


def test_the_overlay_store_tells_an_unchanged_layer_from_its_state(seen: Any) -> None:
    """Right after a checkpoint: unchanged (False); after a write: changed. (An overlay mount may
    move an entry's ctime without a change, which reads as changed: never the other way.) The
    other kinds cannot tell without walking (None), as root's copy store."""
    fs, result = seen
    assert result["changed_since_c2"] == ([False, True] if fs == "ext4" else [None, None])


def test_df_counts_what_removing_the_sandbox_would_give_back(seen: Any) -> None:
    fs, result = seen
    layer, checkpoints, exclusive = result["usage"]
    assert layer > 0 and checkpoints > 0 and exclusive > 0
    if fs == "ext4":  # c2 holds what changed since c1 only (not the 4 MiB file again)
        assert checkpoints < layer * 3 // 2


def test_a_layer_deeper_than_path_max(seen: Any) -> None:
    """Snapshots take any depth; a copy by path (cp -a, as root mode's copy store makes) refuses it
    in one error and leaves nothing behind."""
    fs, result = seen
    if fs.startswith("btrfs"):
        assert result["deep"] == [1500, 1500]
    else:
        assert "File name too long" in result["deep"]["error"]
        assert result["deep"]["left"] == []


def test_removal_leaves_nothing_and_disk_limits_are_refused(seen: Any) -> None:
    _, result = seen
    assert result["left_in_store"] == []
    assert result["disk_limit"].startswith("disk limits need root mode")


def test_the_rootless_base_is_the_sandboxes_own(test_user: TestUser, base_tarball: Path) -> None:
    """Unpacked from the tarball mmdebstrap made, as the user: owned by the mapped range, so a
    sandbox can change its system files (which fail with EACCES over the host's own tree)."""
    cache = test_user.home / ".cache" / "bases"
    result = test_user.run("base", str(cache), str(base_tarball))
    assert result["built"] == result["root"]
    assert any("unpacking" in line for line in result["progress"])
    assert result["second_progress"] == []  # cached: nothing done again
    assert result["usr/bin/apt-get"][:2] == [0, 0]
    assert result["var/cache/apt/archives/partial"][:2] == [42, 0]  # _apt's, as in Debian
    assert result["changed_system_files"] is True
    assert result["base_git_still_there"] is True
