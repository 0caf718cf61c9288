"""The rootless stores under real rootless sandboxes (LocalBackend as the unprivileged test user),
on each storage kind: what an agent does (break a system tool, write files), then checkpoint,
diff, fork and restore, and a disk limit refused in one line."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.store_rootless.harness import TestUser, user_filesystem

KINDS = {"btrfs-rm": ("subvolume", True), "xfs": ("reflink", False), "ext4": ("overlay", False)}


@pytest.fixture(scope="module", params=list(KINDS))
def seen(request: pytest.FixtureRequest, test_user: TestUser, base_tarball: Path) -> Any:
    with user_filesystem(request.param, test_user, size="2G") as mountpoint:
        home = mountpoint / "home"
        home.mkdir()
        os.chown(home, test_user.uid, test_user.gid)
        described = test_user.run("describe", str(home))
        yield request.param, {**test_user.run("backend", str(home), str(base_tarball), timeout=600),
                              "described": described}


def test_the_store_kind_and_its_flag(seen: Any) -> None:
    fs, result = seen
    assert (result["kind"], result["cheap"]) == KINDS[fs]
    assert result["info"]["kind"] == result["kind"]


def test_an_agent_changes_its_system_and_checkpoints_diff_fork_restore(seen: Any) -> None:
    _, result = seen
    assert result["first"] == [0, "0"]  # root inside, and /usr/bin/git of the base could go
    assert ("/etc/apt", "deleted") in [tuple(c) for c in result["diff"]]
    assert ("/root/g", "added") in [tuple(c) for c in result["diff"]]
    assert result["fork_sees"] == "one"
    assert result["restored"] == ["one", "1", "0", "1"]  # f back, g gone, /etc/apt back, git still gone


def test_disk_limits_are_refused_and_nothing_is_left(seen: Any) -> None:
    _, result = seen
    assert result["disk_limit"].startswith("disk limits need root mode")
    assert result["left"] == []


def test_store_info_and_doctor_name_the_store_before_the_base_is_built(seen: Any) -> None:
    fs, result = seen
    described = result["described"]
    kind = KINDS[fs][0]
    assert described["info"]["kind"] == kind and "store base" in described["info"]["rootless base"]
    assert described["info"]["disk limits"].startswith("refused: disk limits need root mode")
    ok, detail = described["doctor"]["sandbox store"]
    assert ok and detail.startswith(f"{kind} at ")
    ok, detail = described["doctor"]["rootless base (Debian root owned by your id range)"]
    assert not ok and "hermes-sandboxes store base" in detail
    assert "store base" in described["reason"]  # the one reason nothing can start yet
