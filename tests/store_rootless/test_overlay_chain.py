"""The overlay store's chained delta checkpoints (ext4), as an ordinary user: random changes of every
kind an overlay layer holds, a checkpoint after each round, deletions in a random order (each folded
into its child), and each remaining checkpoint read through its chain (view, fork, restore) against
what the layer held when it was taken; and every step of a deletion, a checkpoint and a restore
killed midway (failpoints), after which every listed checkpoint still reads as taken."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.store_rootless.harness import TestUser, user_filesystem


@pytest.fixture(scope="module")
def ext4(test_user: TestUser) -> Iterator[Path]:
    with user_filesystem("ext4", test_user) as mountpoint:
        yield mountpoint


def _home(ext4: Path, test_user: TestUser, name: str) -> Path:
    home = ext4 / name
    home.mkdir()
    os.chown(home, test_user.uid, test_user.gid)
    return home


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_checkpoint_of_a_chain_reads_as_taken(ext4: Path, test_user: TestUser, seed: int) -> None:
    result = test_user.run("chain", str(_home(ext4, test_user, f"chain-{seed}")), str(seed))
    kinds = result["kinds"]
    assert kinds["k00"] == {"full": True, "parent": None}
    assert all(kinds[f"k{i:02d}"] == {"full": False, "parent": f"k{i - 1:02d}"} for i in range(1, 12))
    assert result["mismatches"] == []
    assert len(result["remaining"]) == 4
    assert result["restored_last"] is True
    assert result["left"] == []


@pytest.mark.parametrize("point", ["fold-staged", "fold-exchanged", "checkpoint-unrecorded",
                                   "checkpoint-staged", "restore-staged"])
def test_killed_midway_every_listed_checkpoint_still_reads_as_taken(ext4: Path, test_user: TestUser,
                                                                    point: str) -> None:
    result = test_user.run("killed", str(_home(ext4, test_user, point)), point)
    assert result["paused"] is True  # killed at that point, not before or after
    # a deletion is undone or done (its record is the commit point), never half done
    expected = ["k0", "k2"] if point == "checkpoint-unrecorded" else ["k0", "k1", "k2"]
    assert result["listed"] == expected
    assert result["readable"] == dict.fromkeys(expected, True)
    assert result["after_delete"] == {"k0": True, "k2": True}
    assert result["left"] == []


def test_the_helpers_descriptors_miss_no_change_and_keep_no_deleted_file(ext4: Path, test_user: TestUser) -> None:
    """From the second checkpoint of a layer in a process, the store's helper looks at each entry
    through a descriptor it keeps (handles.py): each change made deep in an old subtree, one kind per
    checkpoint, is still in the checkpoint, and a deleted file's blocks come back by the next one."""
    from tests.store_rootless.kit_held import BIG, KINDS

    result = test_user.run("changes", str(_home(ext4, test_user, "held")), module="tests.store_rootless.kit_held")
    assert result["held_after_first"] == 0
    assert result["held_after_second"] > 40  # the path under test: a descriptor per entry of the layer
    assert result["held_at_the_end"] > 30  # less what the changes removed
    assert sorted(result["checkpoints"]) == sorted(KINDS)
    assert result["mismatches"] == []
    assert result["mapped"] == {"c13": [1, 0], "c14": [1, 2]}
    assert result["freed_at_once"] < BIG // 2  # the layer's descriptor kept the file
    assert result["freed_after_checkpoint"] >= BIG * 3 // 4
    assert result["held_after_removal"] == 0
    assert result["left"] == []


def test_a_state_of_either_format_is_a_parent(ext4: Path, test_user: TestUser) -> None:
    """A checkpoint's state as version 2 wrote it (one marshal of every directory's entries) is still
    a parent; version 3's (each directory's entries encoded on their own, reused from the checkpoint
    before for the directories a walk found unchanged) reads back the same, in a new process too."""
    home = _home(ext4, test_user, "formats")
    first = test_user.run("formats", str(home), "1")
    second = test_user.run("formats", str(home), "2")
    taken = {"changed_right_after": False, "reads_as_taken": True, "version": 3}
    assert first["f0"] == taken | {"parent": None}
    assert first["f0_as_version_2"] == {"version": 2, "changed_right_after": False}
    assert first["f1"] == taken | {"parent": "f0"}
    assert first["f2"] == taken | {"parent": "f1"}
    assert second["f3"] == taken | {"parent": "f2"}
    assert {cid: second["views"][cid] for cid in first["views"]} == first["views"]
