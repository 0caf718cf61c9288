"""The user-namespace mapping both modes use (backends/local/userns.py): subordinate blocks, the
rootless map, and root mode's per-sandbox blocks of ids, claimed once and given back."""

from __future__ import annotations

from pathlib import Path

from hermes_sandboxes.backends.local import userns


def test_the_first_block_of_a_user_is_found_by_name_or_id(tmp_path: Path) -> None:
    subuid = tmp_path / "subuid"
    subuid.write_text("alice:100000:65536\nbob:165536:0\n1003:231072:65536\nbob:300000:1000\nbroken\n")
    assert userns.subordinate_block(subuid, "alice", 1001) == (100000, 65536)
    assert userns.subordinate_block(subuid, "bob", 1002) == (300000, 1000)  # an empty block is no block
    assert userns.subordinate_block(subuid, "carol", 1003) == (231072, 65536)
    assert userns.subordinate_block(subuid, "dave", 1004) is None
    assert userns.subordinate_block(tmp_path / "missing", "alice", 1001) is None


def test_an_id_map_translates_inner_ids_and_writes_the_kernels_format() -> None:
    idmap = userns.IdMap(((0, 1000, 1), (1, 100000, 65535)), ((0, 1000, 1), (1, 100000, 65535)))
    assert idmap.full and idmap.inner_count == 65536
    assert idmap.outer_uid(0) == 1000 and idmap.outer_uid(42) == 100041 and idmap.outer_uid(65536) is None
    assert idmap.text("uid") == "0 1000 1\n1 100000 65535\n"
    alone = userns.IdMap(((0, 1000, 1),), ((0, 1000, 1),))
    assert not alone.full and alone.outer_gid(1) is None


def test_root_mode_blocks_are_above_every_subordinate_range_and_apart() -> None:
    first, other = userns.root_range_map(0), userns.root_range_map(1)
    assert first.outer_uid(0) == userns.ROOT_RANGE_BASE > 600100000  # useradd's SUB_UID_MAX
    assert other.outer_uid(0) == (first.outer_uid(userns.RANGE_SIZE - 1) or 0) + 1
    last = userns.root_range_map(userns.ROOT_RANGE_SLOTS - 1)
    assert (last.outer_uid(userns.RANGE_SIZE - 1) or 0) < 2**32 - 1


def test_a_sandbox_keeps_its_block_and_two_sandboxes_never_share_one(tmp_path: Path) -> None:
    claims = tmp_path / "claims"
    home = tmp_path / "home"
    slots = {name: userns.claim_slot(home, name, claims) for name in ("a", "b", "c")}
    assert len(set(slots.values())) == 3
    assert userns.claim_slot(home, "b", claims) == slots["b"]
    assert userns.claim_slot(tmp_path / "other-home", "a", claims) != slots["a"]
    userns.release_slot(home, "b", claims)
    assert not (claims / str(slots["b"])).exists()
    assert (claims / str(slots["a"])).exists()
    assert claims.stat().st_mode & 0o777 == 0o700
