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
