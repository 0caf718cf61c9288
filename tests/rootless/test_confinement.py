"""Confinement as a laptop user would have it (#19 point 5), shown as a normal user: the user's own
secrets under $HOME, files, /tmp and processes are out of a rootless sandbox's reach."""

from __future__ import annotations

from typing import Any

import pytest

from tests.rootless import kit


@pytest.fixture(scope="module")
def seen(rootless_user: kit.TestUser) -> dict[str, Any]:
    return rootless_user.scenario("confinement")


def test_the_users_home_its_secrets_and_the_hosts_tmp_are_invisible(seen: dict[str, Any]) -> None:
    assert seen["listed"] == "", seen["listed"]  # none of the paths exists inside; /tmp is the sandbox's own
    assert seen["grep"] == "", f"the planted secret is readable inside at: {seen['grep']}"


def test_configured_masks_hide_their_directory_and_file_inside(seen: dict[str, Any]) -> None:
    assert seen["masked"].splitlines()[-1] != "0"  # an empty read-only directory, an empty file
    assert seen["masked"].splitlines()[:-1] == []


def test_files_the_user_owns_cannot_be_written_from_inside(seen: dict[str, Any]) -> None:
    assert seen["owned_after"] == "mine\n"


def test_the_users_other_processes_cannot_be_signalled(seen: dict[str, Any]) -> None:
    assert seen["other_alive"]
    assert seen["kill"].splitlines()[0] != "0"  # that pid does not exist in the sandbox's pid namespace
    pids = [line.split() for line in seen["ps"].splitlines()]
    assert all(comm != "sleep" for _, comm in pids), seen["ps"]
    assert pids and pids[0][0] == "1"  # its own pid namespace: the init is 1


def test_root_inside_is_the_user_and_its_subordinate_ids(rootless_user: kit.TestUser, seen: dict[str, Any]) -> None:
    first = seen["uid_map"].split()
    assert first[:3] == ["0", str(rootless_user.uid), "1"]


@pytest.fixture(scope="module")
def escapes(rootless_user: kit.TestUser) -> dict[str, Any]:
    return rootless_user.scenario("escapes")


def test_every_system_call_the_filter_denies_is_denied_rootless_too(escapes: dict[str, Any]) -> None:
    from tests.local.test_escapes import EXPECTED_INSIDE

    assert escapes["probe"] == EXPECTED_INSIDE


def test_another_store_of_the_same_user_is_out_of_reach(escapes: dict[str, Any]) -> None:
    assert escapes["grep"] == "" and "No such file or directory" in escapes["victim_home"]


def test_the_init_and_the_capabilities_are_as_in_root_mode(escapes: dict[str, Any]) -> None:
    from hermes_sandboxes.backends.local.guest.init import KEPT_CAPABILITIES

    assert "PATH=" not in escapes["init"] and "Permission denied" in escapes["init"]  # /proc/1 is not dumpable
    assert int(escapes["capbnd"], 16) == sum(1 << cap for cap in KEPT_CAPABILITIES)
    assert escapes["nnp"] == "1" and escapes["seccomp"] == "2"
