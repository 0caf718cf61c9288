"""Rootless limits for real: tests/guest/rootless_delegated.py run inside the cgroup v2 guest."""

from __future__ import annotations

import pytest

from tests.guest import harness

GUEST_TESTS = ["tests/guest/rootless_delegated.py"]


@pytest.mark.timeout(900)
def test_rootless_limits_hold_in_a_delegated_cgroup_v2_subtree_in_a_guest() -> None:
    reason = harness.available()
    if reason:
        pytest.fail(reason)  # the machine can run the guest: not running it would hide the delegated path
    result = harness.run(GUEST_TESTS, timeout=800)
    assert result.exit_code == 0, result.tail()
    assert result.outcomes and set(result.outcomes.values()) == {"passed"}, result.outcomes
    harness.forget(result)
