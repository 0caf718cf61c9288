"""The suite's markers, given by where a test lives and what it needs, in one place.

- ``root``: runs real sandboxes (namespaces, mounts, cgroups, loop devices): everything but the pure
  unit tests and the packaging checks needs a root shell.
- ``qemu``: boots the cgroup v2 guest under software emulation (``tests/guest``).
- ``fake_cloud``: drives the real Sprites or E2B SDK against the loopback fakes (``tests/fakes``).
- ``clients``: runs real agent clients (Codex CLI, Claude Code) against the scripted model server.
- ``slow``: one of the slowest tests (listed in ``SLOW``, measured on the development machine with
  ``pytest --durations``), so that ``pytest -m "not qemu and not slow"`` is a quick loop.

Every marker is registered (``pyproject.toml``) and the suite runs with ``--strict-markers``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
NO_ROOT = {"unit"}  # directories whose tests never make a sandbox
NO_ROOT_FILES = {"docs/test_packaging.py", "local/test_guest_imports.py"}
BY_DIRECTORY = {"guest": ("qemu",), "sprites": ("fake_cloud",), "e2b": ("fake_cloud",), "remote": ("fake_cloud",)}
CLOUD_PARAMETERS = ("[sprites", "[e2b", "-sprites]", "-e2b]", "sprites-", "e2b-")

# Test files (or single tests, as node ids) that take long: measured with --durations in a clean-clone
# run of the whole suite (2,079 s of tests at load 11), the slowest first; together about two thirds of
# the suite's time. Tests that mark themselves with pytest.mark.slow are slow too.
SLOW: tuple[str, ...] = (
    "hermes/test_agent_loop.py",  # real hermes chat -q runs: 291 s
    "hermes/test_agent_egress.py",  # 218 s
    "local/test_store_admin.py",  # store migrate / reclaim / killed creates: 192 s
    "remote/test_hermes_state.py",  # 146 s
    "hermes/test_agent_features.py",  # 81 s
    "cli/test_cli_kill9.py",  # kill sweeps: 68 s
    "bench/test_benchmarks.py",  # the benchmarks in quick mode: 51 s
    "e2b/test_e2b_writer_lease.py",  # 40 s
    "sprites/test_sprites_benchmark.py",  # 12 s
    "mcp/test_mcp_clients.py",  # real Codex CLI and Claude Code
    "store_rootless/test_rootless_store.py::test_the_rootless_base_is_the_sandboxes_own",  # ~55 s: unpacks 270 MB
    "local/test_checkpoints.py::test_a_tree_deeper_than_any_path_limit_cannot_break_the_store",  # 55 s
    "local/test_interrupted.py::test_an_init_whose_starter_was_killed_before_recording_it_is_killed_by_the_next_start",
    "local/test_limits.py::test_the_cpu_limit_is_applied_and_throttles",  # 28 s
    "cli/test_cli_robust.py::test_checkpoints_diffs_and_previews_survive_any_bytes_in_comments_and_paths",
    "recorder/test_recorder_promises.py::test_commands_that_change_nothing_reuse_the_last_checkpoint_even_under_policy_always",
    "local/test_egress.py::test_the_proxy_ca_is_in_the_system_store_while_brokering_and_never_in_a_diff",
    "cli/test_cli_network.py::test_simultaneous_allows_of_distinct_hosts_all_land",
)


def marks_for(item: pytest.Item) -> list[str]:
    rel = Path(str(item.path)).resolve().relative_to(TESTS).as_posix()
    top = rel.split("/", 1)[0]
    marks = list(BY_DIRECTORY.get(top, ()))
    if top not in NO_ROOT and rel not in NO_ROOT_FILES:
        marks.append("root")
    if any(p in item.name for p in CLOUD_PARAMETERS) and "fake_cloud" not in marks:
        marks.append("fake_cloud")
    node = f"{rel}::{item.name}"
    if any(rel == s or node == s or node.startswith(s + "[") for s in SLOW):
        marks.append("slow")
    return marks


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for name in marks_for(item):
            item.add_marker(name)
