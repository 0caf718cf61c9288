"""cgroup v2, for real: the local backend's cgroup, limit and timeout tests, run inside a QEMU guest
whose only cgroup hierarchy is v2 (this host keeps its controllers on v1; see harness.py).

Python in the emulated guest is 12-18x slower than here, so only a focused subset runs there: the
limits, the containment tests and the timeouts and kills that rest on freezing and cgroup.kill
(about two minutes, boot included; the slowest of the local tests stay on the host only). Tests
that give a command a fixed second or so are left out: under emulation on a busy host a shell may
not even start within it.
"""

from __future__ import annotations

import pytest

from tests.guest import harness

GUEST_TESTS = [
    "tests/local/test_limits.py",
    "tests/local/test_oom_init.py::test_filling_dev_shm_or_memory_ends_the_command_and_the_sandbox_lives_on",
    "tests/local/test_cgroups.py::test_the_init_and_its_commands_are_in_their_own_group_in_every_hierarchy",
    "tests/local/test_cgroups.py::test_a_cgroup_mount_in_the_sandboxs_namespace_sees_only_its_box",
    "tests/local/test_cgroups.py::test_root_inside_cannot_reach_host_groups_nor_lift_its_limits",
    "tests/local/test_cgroups.py::test_the_shared_parent_carries_a_ceiling_for_all_sandboxes_together",
    "tests/local/test_cgroups.py::test_doctor_says_which_cgroup_version_is_in_use_and_that_nothing_is_missing",
    "tests/local/test_processes.py::test_the_children_exist_until_the_timeout",
    "tests/local/test_processes.py::test_a_timeout_kills_setsid_nohup_and_double_forked_children_but_not_an_earlier_daemon",
    "tests/local/test_processes.py::test_kill_from_start_ends_the_command_and_everything_it_started",
    "tests/local/test_persistence.py::test_after_stop_the_next_exec_starts_the_init_again_and_files_are_there",
    "tests/local/test_interrupted.py::test_a_checkpoint_killed_midway_leaves_the_sandbox_usable_and_lists_nothing_partial[btrfs]",
]


def _selected(outcomes: dict[str, str], selector: str) -> list[str]:
    """The JUnit ids (``tests.local.module::name[param]``) a pytest selector stands for."""
    path, _, name = selector.partition("::")
    module = path.removesuffix(".py").replace("/", ".")
    found = []
    for test_id in outcomes:
        test_module, _, test_name = test_id.partition("::")
        if test_module == module and (not name or test_name == name or test_name.startswith(name + "[")):
            found.append(test_id)
    return found


@pytest.mark.timeout(600)
def test_limits_freezing_and_tree_kills_hold_on_cgroup_v2_in_a_guest() -> None:
    reason = harness.available()
    if reason:
        pytest.fail(reason)  # the machine can run the guest: not running it would hide the v2 path
    result = harness.run(GUEST_TESTS, timeout=480)
    # the guest chose v2, with every limit controller and nothing missing
    assert "hsg: cgroup version 2 limits ['cpu', 'memory', 'pids'] missing []" in result.console, result.tail()
    assert result.exit_code == 0, result.tail()
    assert result.outcomes and set(result.outcomes.values()) == {"passed"}, result.outcomes
    for selector in GUEST_TESTS:
        assert _selected(result.outcomes, selector), f"{selector} did not run in the guest"
    harness.forget(result)  # kept on failure: build/guest/run-*/console.log and junit.xml
