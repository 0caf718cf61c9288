"""Limits without a delegated cgroup (#19 point 3), as a normal user on this host (cgroup v1, none of
it the user's): memory and cpus refused in one line, processes limited per id inside, a command's
session killed whole, a checkpoint's freeze stops every process but the init and lets them go after.
The delegated cgroup v2 case runs in the QEMU guest (tests/guest/test_rootless_guest.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.rootless import kit


@pytest.fixture(scope="module")
def seen(rootless_user: kit.TestUser) -> dict[str, Any]:
    return rootless_user.scenario("no_cgroup")


def test_what_cannot_be_enforced_is_refused_in_one_line_and_not_declared(seen: dict[str, Any]) -> None:
    assert "TREE_KILL" not in seen["capabilities"] and "LIMITS" in seen["capabilities"]
    refused = seen["memory_refused"]
    assert "cannot enforce a memory limit" in refused and "\n" not in refused


def test_the_process_limit_is_an_rlimit_inside(seen: dict[str, Any]) -> None:
    assert seen["nproc"] == "200"


def test_a_checkpoints_freeze_stops_the_sandboxs_processes_and_lets_them_go(seen: dict[str, Any]) -> None:
    assert seen["frozen_state"] == "T" and seen["marked"]
    assert seen["thawed_state"] != "T" and not seen["marked_after"]


def test_a_kill_ends_the_commands_session_and_no_earlier_process(seen: dict[str, Any]) -> None:
    assert seen["after_kill"].split()[1:] == ["sleep", "600"], seen["after_kill"]
    assert "601" not in seen["after_kill"] and "602" not in seen["after_kill"]
