"""The suite's markers, given by where a test lives and what it needs, in one place.

- ``root``: runs real sandboxes (namespaces, mounts, cgroups, loop devices): everything but the pure
  unit tests and the packaging checks needs a root shell.
- ``qemu``: boots the cgroup v2 guest under software emulation (``tests/guest``).
- ``fake_cloud``: drives the real Sprites or E2B SDK against the loopback fakes (``tests/fakes``).
- ``clients``: runs real agent clients (Codex CLI, Claude Code) against the scripted model server.
- ``slow``: one of the slowest tests (listed in ``SLOW``, measured on the development machine with
  ``pytest --durations``), so that ``pytest -m "not qemu and not slow"`` is a quick loop (under three
  minutes on a quiet 2-vCPU machine; docs/development.md). ``QUICK`` names the tests of a slow file
  that stay in the quick loop, so that every file (one guarantee each) keeps at least one fast test
  there. The full suite runs every test: markers only select.

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
    # Issue 18 point 7, the quick loop: every test of the quick selection that took 1.5 s or more in
    # one run of it (pytest -m "not qemu and not slow" --durations=0, 2 Dec 2026 18:37 UTC, load
    # 13 -> 5: 1,877 tests, 1,130 s; about twice as fast quiet), with the seconds it took there.
    # Whole files, with the tests named in QUICK kept:
    "local/test_hostile_trees.py",  # 4,000-deep trees and 3,000-file diffs: 158 s (CLI preview 70 s)
    "local/test_idle.py",  # idle timeouts waited out: 21 s
    "local/test_walk_race.py",  # diffs racing a swapping sandbox: 15 s
    "rootless/test_suites.py",  # the local suites rerun as a normal user: 40 s
    "e2b/test_e2b_slash.py",  # a real hermes chat undoing on E2B: 44 s
    "sprites/test_sprites_slash.py",  # a real hermes chat undoing on a Sprite: 16 s
    # single tests (a name without parameters takes all of them):
    "local/test_egress_attacks.py::test_an_intercepted_request_that_names_another_authority_is_refused",  # 64 s
    "local/test_egress_attacks.py::test_a_flood_of_refused_connections_is_aggregated_clipped_and_counted",  # 10 s
    "local/test_egress_attacks.py::test_the_certificate_cache_is_bounded",  # 5.4 s
    "local/test_egress_attacks.py::test_every_spelling_of_a_host_gets_one_certificate",
    "local/test_egress_attacks.py::test_the_audit_limiter_keeps_its_budget_and_counts_what_it_did_not_write",
    "local/test_disk_quota.py::test_a_restore_killed_at_any_point_leaves_the_old_or_the_new_layer_limited",  # 7 s
    "local/test_disk_quota.py::test_a_sandbox_cannot_write_past_its_disk_limit",  # 3.3 s
    "local/test_isolation.py::test_another_sandbox_s_journal_and_the_host_state_directory_are_out_of_reach",  # 7 s
    "local/test_limits.py::test_a_fork_bomb_is_contained_and_the_sandbox_survives",  # 4.2 s
    "local/test_checkpoints.py::test_restore_brings_back_every_kind_of_file_exactly",  # 3.8 s
    "local/test_processes.py::test_a_timeout_kills_setsid_nohup_and_double_forked_children_but_not_an_earlier_daemon",
    "local/test_stub.py::test_a_fork_bomb_s_timeout_leaves_the_stubs_and_the_init_serving",  # 2.7 s
    "local/test_concurrency.py::test_twenty_sandboxes_created_and_run_concurrently_all_succeed",  # 2.3 s
    "local/test_interrupted.py::test_a_checkpoint_killed_midway_leaves_the_sandbox_usable_and_lists_nothing_partial[copy]",
    "local/test_prereqs.py::test_setup_apparmor_prints_its_profile_and_refuses_to_install_without_root",  # 2.2 s
    "local/test_helper_isolation.py::test_helpers_never_import_from_the_caller_s_directory_or_module_path[0]",  # 5 s
    "local/test_egress.py::test_pip_downloads_from_a_local_index_through_the_proxy",
    "local/test_egress.py::test_the_placeholder_becomes_the_secret_for_the_credential_s_hosts_only",
    "local/test_egress.py::test_a_trust_store_the_sandbox_turned_into_a_symlink_is_not_followed_on_the_host",
    "cli/test_cli_warm.py::test_a_changed_package_file_makes_the_server_step_aside_for_a_new_one",  # 12 s
    "cli/test_cli_warm.py::test_a_server_that_never_answers_costs_a_bounded_wait_then_runs_in_process",  # 8 s
    "cli/test_cli_warm.py::test_a_signal_before_the_worker_is_known_acts_on_the_cli_as_it_would_in_process",  # 7 s
    "cli/test_cli_warm.py::test_the_servers_fork_server_ends_with_the_server_however_it_ends",  # 6.4 s
    "cli/test_cli_warm.py::test_ctrl_c_while_the_exec_path_starts_up_prints_no_traceback",  # 5 s
    "cli/test_cli_warm.py::test_clients_racing_to_start_a_server_leave_one",  # 3.7 s
    "cli/test_cli_warm.py::test_another_user_is_not_served",  # 3.2 s
    "cli/test_cli_warm.py::test_a_sandbox_started_warm_is_forked_from_the_servers_fork_server_which_leaves_with_it",
    "cli/test_cli_warm.py::test_a_killed_server_costs_one_in_process_call_then_a_new_server_serves",
    "cli/test_cli_warm.py::test_concurrent_calls_are_served_by_their_own_workers",
    "cli/test_cli_warm.py::test_shell_runs_in_process",
    "cli/test_cli_warm.py::test_signals_reach_the_worker_which_stops_and_records_the_command[2]",
    "cli/test_cli_warm.py::test_signals_reach_the_worker_which_stops_and_records_the_command[15]",
    "cli/test_cli_warm.py::test_warm_and_in_process_give_the_same_bytes_codes_and_records[a timeout]",
    "cli/test_cli_warm.py::test_a_spare_worker_waits_ahead_and_a_killed_one_is_replaced",
    "cli/test_cli_warm.py::test_a_reader_that_goes_away_ends_the_call_with_141_either_way[warm]",
    "cli/test_cli_warm.py::test_other_commands_give_the_same_bytes_and_codes_warm_as_in_process"
    "[a question nobody can answer]",
    "cli/test_cli_warm.py::test_an_idle_server_exits_and_removes_its_socket",
    "cli/test_cli_warm.py::test_warm_off_runs_in_process_and_starts_no_server",
    "cli/test_cli_settings.py::test_exec_checkpoints_as_auto_checkpoint_says_when_checkpoint_is_not_given"
    "[in-process fast path]",  # 3.9 s
    "cli/test_cli_robust.py::test_the_next_call_or_gc_collects_the_sandbox_of_a_run_killed_with_sigkill",
    "hermes/test_slash.py::test_the_human_undoes_what_the_agent_broke_and_the_agent_hears_of_it",  # 36 s
    "hermes/test_slash.py::test_in_a_gateway_each_chat_acts_on_its_own_sessions_sandbox",
    "hermes/test_slash.py::test_undo_from_the_chat_resyncs_a_live_session_and_fork_leaves_it_alone",
    "hermes/test_terminal.py::test_output_streams_so_a_timed_out_command_keeps_what_it_printed",  # 3 s
    "hermes/test_terminal.py::test_a_timeout_kills_the_commands_whole_tree_but_the_sandbox_survives",  # 2.9 s
    "hermes/test_promises.py::test_commands_that_change_only_hermess_scratch_files_add_no_checkpoint_even_under_always",
    "hermes/test_brokered_profile.py::test_a_multiplexing_gateway_uses_the_bound_profile_s_value_and_none_without_one",
    "hermes/test_sharing.py::test_two_profiles_never_share_a_sandbox",
    "rootless/test_faces.py::test_hermes_chat_breaks_and_restores_a_sandbox_as_a_normal_user",  # 19 s
    "rootless/test_faces.py::test_the_mcp_server_over_stdio_works_as_a_normal_user",  # 2.7 s
    "rootless/test_faces.py::test_the_demo_passes_as_a_normal_user",  # 2.5 s
    "rootless/test_confinement.py::test_the_users_home_its_secrets_and_the_hosts_tmp_are_invisible",  # 4.4 s
    "rootless/test_confinement.py::test_every_system_call_the_filter_denies_is_denied_rootless_too",  # 3.3 s
    "store_rootless/test_rootless_backend.py::test_the_store_kind_and_its_flag",  # 8.7 s
    "e2b/test_e2b_hermes_plugin.py::test_a_resumed_sandbox_takes_a_changed_allow_setting_but_keeps_a_change_made_from_the_shell",
    "e2b/test_e2b_hermes_plugin.py::test_a_real_hermes_runs_its_terminal_tool_in_an_e2b_sandbox_with_checkpoints",
    "e2b/test_e2b_cleanup.py::test_cleanup_during_a_command_is_deferred_until_it_ends",  # 4.6 s
    "e2b/test_e2b_cleanup.py::test_a_finalised_environment_never_pulls_and_only_an_ephemeral_sandbox_is_destroyed[persistent]",
    "e2b/test_e2b_backend.py::test_a_timeout_kills_the_command_by_pid_and_the_sandbox_and_background_survive",  # 3.7 s
    "e2b/test_e2b_backend.py::test_an_allow_list_becomes_e2bs_egress_rules_and_changes_in_place",
    "e2b/test_e2b_backend.py::test_fork_starts_a_new_named_sandbox_from_now_or_from_a_checkpoint",
    "e2b/test_e2b_backend.py::test_checkpoints_are_snapshots_and_restore_replaces_the_sandbox_keeping_identity",
    "e2b/test_e2b_upstream_scope.py::test_a_real_hermes_stamps_the_scope_the_existing_plugin_computes",  # 2.5 s
    "e2b/test_e2b_upstream_scope.py::test_a_real_hermes_adopts_a_sandbox_the_existing_plugin_made",
    "e2b/test_e2b_cli.py::test_the_cli_drives_an_e2b_sandbox_end_to_end",  # 2.3 s
    "sprites/test_sprites_egress.py::test_a_real_hermes_with_the_allow_setting_fences_its_sprite_and_hermes_sandbox_network_opens_a_name",
    "sprites/test_sprites_backend.py::test_a_command_that_ignores_sigterm_is_killed_by_the_services_sigkill",  # 4.6 s
    "sprites/test_sprites_backend.py::test_a_create_slower_than_the_wait_fails_with_retry_and_is_picked_up_later",
    "sprites/test_sprites_backend.py::test_two_processes_opening_one_name_end_with_one_sprite_and_no_error",
    "sprites/test_sprites_backend.py::test_the_size_asked_for_is_the_size_the_sprite_gets",
    "sprites/test_sprites_backend.py::test_transient_server_errors_and_rate_limits_are_retried",
    "sprites/test_sprites_backend.py::test_an_exec_socket_refused_every_time_is_a_retryable_error_and_nothing_ran",
    "sprites/test_sprites_backend.py::test_a_token_echoed_by_the_service_never_reaches_an_error_message",
    "sprites/test_sprites_backend.py::test_a_server_that_stays_down_is_a_retryable_unreachable_error",
    "sprites/test_sprites_hermes_plugin.py::test_a_real_hermes_runs_its_terminal_tool_in_a_sprite_with_checkpoints",
    "sprites/test_sprites_hermes_plugin.py::test_a_session_resumes_its_sprite_as_made_when_the_size_setting_changed",
    "sprites/test_sprites_published_shapes.py::test_a_create_rate_limited_every_time_says_why_and_when_to_retry",
    "sprites/test_sprites_fake_server.py::test_two_processes_creating_one_name_end_with_one_sprite",
    "sprites/test_sprites_cli.py::test_checkpoints_through_the_cli",  # 2.2 s
    "sprites/test_sprites_cli.py::test_create_exec_timeout_and_rm_through_the_cli",
    "mcp/test_mcp_http.py::test_an_sdk_client_with_the_token_runs_commands_with_progress_and_restores",  # 4.6 s
    "mcp/test_mcp_http.py::test_a_cancelled_call_over_http_kills_the_command_and_records_it",  # 3.2 s
    "mcp/test_mcp_sessions.py::test_the_real_command_over_stdio_records_what_it_runs",
    "recorder/test_journal.py::test_writers_killed_mid_stream_leave_a_readable_journal_with_every_acknowledged_entry",
    "recorder/test_recorder_promises.py::test_a_session_of_200_harmless_commands_adds_no_automatic_checkpoint",
    "docs/test_readme.py::test_a_checked_readme_example_prints_what_the_readme_shows[README.md:26]",  # 3.2 s
    "docs/test_readme.py::test_the_readme_python_example_runs_as_printed_and_prints_what_its_comments_say",  # 3.2 s
    "docs/test_setup_script.py::test_a_held_lock_is_waited_for_visibly_and_the_wait_ends_when_it_is_released",
    # The second pass (3 Dec 2026 06:40 UTC, load 0.4 -> 2.4: 1,763 tests, 251 s of wall time, 245 s of
    # tests): every quick-selection test of 0.7 s or more, with the seconds it took there, and the
    # repeats on the cloud fakes of the contract and the rootless stores' other kinds, whose one fixture
    # per kind costs 2-8 s (``FILE::*[ID]`` names every test of FILE with the parameter ID); QUICK keeps
    # one test per file and kind. Single tests of files that keep others:
    "remote/test_recovery.py::test_an_oversized_archive_is_cut_off_while_it_streams",  # [sprites] 16 s
    "bench/test_bench_mcp.py",  # its one test: 4.4 s
    "e2b/test_e2b_mcp.py",  # its one test: 3.2 s (the MCP story stays: mcp/, sprites/test_sprites_mcp.py)
    "hermes/test_idle_setting.py",  # its one test: 2.4 s (idle stops stay: local/test_idle.py's QUICK)
    "unit/test_values.py::test_values_survive_pickling",  # 3.5 s
    "unit/test_markers.py",  # collects the whole suite: 7 s
    "contract/test_contract_commands.py::*[sprites]",
    "contract/test_contract_commands.py::*[e2b]",
    "contract/test_contract_checkpoints.py::*[sprites]",
    "contract/test_contract_checkpoints.py::*[e2b]",
    "contract/test_contract_tags.py::*[sprites]",
    "contract/test_contract_tags.py::*[e2b]",
    "contract/test_contract_spec.py::*[e2b]",
    "contract/test_contract_commands.py::test_a_tree_kill_takes_detached_children_too_where_the_backend_promises_it"
    "[local-degraded]",  # 1.1 s ([local] stays: the quick loop's timeout and tree kill)
    "contract/test_contract_commands.py::test_a_timeout_stops_the_command_with_exit_124[local-degraded]",  # 1.1 s
    "store_rootless/test_rootless_store.py::*[btrfs-rm]",  # 2.2 s
    "store_rootless/test_rootless_store.py::*[xfs]",  # 2.7 s
    "store_rootless/test_rootless_store.py::*[ext4]",  # 4.6 s
    "store_rootless/test_rootless_backend.py::*[btrfs-rm]",  # 8.3 s
    "store_rootless/test_rootless_backend.py::*[xfs]",  # 2.1 s
    "store_rootless/test_rootless_backend.py::test_disk_limits_are_refused_and_nothing_is_left",  # 1.6 s
    "store_rootless/test_rootless_backend.py::test_store_info_and_doctor_name_the_store_before_the_base_is_built",
    "store_rootless/test_overlay_chain.py::test_killed_midway_every_listed_checkpoint_still_reads_as_taken"
    "[restore-staged]",  # 1.4 s
    # test_confinement's ``seen`` fixture (2 s) with every test of it; its ``escapes`` ones stay
    "rootless/test_confinement.py::test_configured_masks_hide_their_directory_and_file_inside",
    "rootless/test_confinement.py::test_files_the_user_owns_cannot_be_written_from_inside",
    "rootless/test_confinement.py::test_the_users_other_processes_cannot_be_signalled",
    "rootless/test_confinement.py::test_root_inside_is_the_user_and_its_subordinate_ids",
    "cli/test_cli_warm.py::test_other_commands_give_the_same_bytes_and_codes_warm_as_in_process[log]",  # 1.3 s
    "cli/test_cli_warm.py::test_other_commands_give_the_same_bytes_and_codes_warm_as_in_process[checkpoint list]",
    "cli/test_cli_warm.py::test_other_commands_give_the_same_bytes_and_codes_warm_as_in_process[ls]",  # 1.2 s
    "cli/test_cli_warm.py::test_other_commands_give_the_same_bytes_and_codes_warm_as_in_process[bad usage]",
    "cli/test_cli_warm.py::test_other_commands_give_the_same_bytes_and_codes_warm_as_in_process"
    "[an unknown checkpoint]",  # 0.8 s
    "cli/test_cli_warm.py::test_other_commands_give_the_same_bytes_and_codes_warm_as_in_process[config]",  # 0.8 s
    "cli/test_cli_warm.py::test_other_commands_give_the_same_bytes_and_codes_warm_as_in_process"
    "[a command's help]",  # 0.7 s
    "cli/test_cli_warm.py::test_signals_reach_the_worker_which_stops_and_records_the_command[1]",  # 1 s
    "cli/test_cli_warm.py::test_warm_and_in_process_give_the_same_bytes_codes_and_records[env and cwd options]",
    "cli/test_cli_warm.py::test_warm_and_in_process_give_the_same_bytes_codes_and_records[bytes and codes]",
    "cli/test_cli_warm.py::test_warm_and_in_process_give_the_same_bytes_codes_and_records"
    "[bytes in the command line]",  # 0.8 s
    "cli/test_cli_warm.py::test_warm_and_in_process_give_the_same_bytes_codes_and_records[stdin with its end]",
    "cli/test_cli_warm.py::test_warm_and_in_process_give_the_same_bytes_codes_and_records[a bad option]",
    "cli/test_cli_warm.py::test_under_nohup_a_hang_up_leaves_the_call_and_its_command_running[warm]",  # 1 s
    "cli/test_cli_warm.py::test_the_worker_takes_on_the_clients_environment_directory_umask_and_ignored_signals",
    "cli/test_cli_warm.py::test_a_checkpoint_taken_warm_is_recorded_by_the_worker",  # 0.8 s
    "cli/test_cli_warm.py::test_a_run_whose_client_is_killed_is_destroyed_by_its_worker",  # 0.7 s
    "cli/test_cli_warm.py::test_the_exec_of_a_running_command_is_recorded_by_the_worker_as_running",  # 0.7 s
    "cli/test_cli_warm.py::test_a_client_killed_with_sigkill_has_its_command_stopped_inside_and_recorded",
    "cli/test_cli_checkpoints.py::test_a_hung_health_command_is_killed_at_its_timeout_and_counts_as_failed",  # 1.2 s
    "cli/test_cli.py::test_exec_stops_a_command_at_its_timeout_with_exit_124",  # 1.1 s
    "cli/test_cli.py::test_run_destroys_its_sandbox_after_a_timeout",  # 1.1 s
    "cli/test_cli_settings.py::test_exec_checkpoints_as_auto_checkpoint_says_when_checkpoint_is_not_given[warm]",
    "cli/test_cli_shell.py::test_ctrl_z_stops_the_foreground_job_and_the_shell_takes_the_terminal_back",  # 0.7 s
    "e2b/test_e2b_cleanup.py::test_cleanup_of_a_vanished_sandbox_and_a_repeated_cleanup_do_nothing[persistent]",
    "e2b/test_e2b_cleanup.py::test_a_persistent_sandbox_e2b_paused_is_resumed_for_the_pull_back_and_left_to_pause"
    "_again",  # 0.8 s
    "e2b/test_e2b_cleanup.py::test_a_finalised_environment_never_pulls_and_only_an_ephemeral_sandbox_is_destroyed"
    "[ephemeral]",  # 0.7 s
    "e2b/test_e2b_backend.py::test_by_name_another_posture_template_or_labels_is_refused_and_no_spec_resumes_it",
    "e2b/test_e2b_backend.py::test_for_a_hermes_task_a_tightened_posture_gives_a_new_sandbox_beside_the_old",
    "e2b/test_e2b_backend.py::test_an_ephemeral_sandbox_is_killed_at_its_lease_end_and_on_destroy",  # 0.8 s
    "e2b/test_e2b_backend.py::test_errors_are_mapped_and_never_show_the_key",  # 0.8 s
    "e2b/test_e2b_backend.py::test_a_paused_sandbox_is_resumed_by_the_next_command",  # 0.8 s
    "e2b/test_e2b_backend.py::test_exec_returns_code_and_both_streams_with_the_lease_extended_first_when_short",
    "e2b/test_e2b_backend.py::test_open_creates_a_persistent_sandbox_once_and_finds_it_again",  # 0.7 s
    "e2b/test_e2b_upstream_scope.py::test_a_sandbox_opened_for_a_task_is_found_again_by_its_name_and_the_other_way"
    "_round",  # 0.9 s
    "e2b/test_e2b_fake_server.py::test_the_stream_deadline_bounds_a_command_and_closing_a_stream_does_not",  # 0.9 s
    "e2b/test_e2b_hermes_plugin.py::test_a_command_with_a_long_deadline_gets_its_lease_before_it_starts",  # 0.7 s
    "sprites/test_sprites_published_shapes.py::test_a_rate_limited_create_waits_what_the_service_asks_then_succeeds",
    "sprites/test_sprites_backend.py::test_a_timeout_kills_the_remote_command_through_the_kill_endpoint",  # 1.1 s
    "sprites/test_sprites_backend.py::test_a_rate_limited_exec_is_retried_before_anything_runs",  # 1.1 s
    "sprites/test_sprites_backend.py::test_checkpoints_are_created_with_a_comment_listed_and_restored",  # 0.7 s
    "sprites/test_sprites_fake_server.py::test_a_slow_create_is_visible_as_creating_and_blocks_the_name",  # 1.1 s
    "sprites/test_sprites_diff.py::test_after_a_restore_the_newest_five_are_still_mounted",  # 0.7 s
    "local/test_egress_attacks.py::test_new_certificates_are_issued_at_a_bounded_rate",  # 1.3 s
    "local/test_egress.py::test_without_brokering_the_system_store_is_the_base_s",  # 1.1 s
    "local/test_processes.py::test_a_timeout_returns_124_and_says_so",  # 1 s
    "local/test_stub.py::test_a_command_after_a_quiet_spell_is_a_stub_born_in_its_own_group",  # 0.7 s
    "mcp/test_mcp_sessions.py::test_a_cancelled_exec_kills_the_command_tree_and_is_recorded_as_interrupted",  # 1.1 s
    "remote/test_recovery.py::test_missing_files_come_back_in_place_and_conflicts_are_kept_aside[e2b]",  # 0.7 s
)

# The fast tests of the slow files above that stay in the quick loop (the file's guarantee in one test).
QUICK: tuple[str, ...] = (
    "local/test_hostile_trees.py::test_a_diff_past_its_budget_says_so_instead_of_running_on[btrfs]",  # 0.7 s
    "local/test_hostile_trees.py::test_the_btrfs_hint_before_the_walk_is_held_to_the_same_budget",  # 0.7 s
    "local/test_idle.py::test_an_idle_timeout_is_refused_unless_positive",
    "local/test_idle.py::test_the_cli_and_the_config_file_set_it",
    "local/test_walk_race.py::test_a_tree_walk_does_not_follow_symlinks_anywhere",
    # one test per file and cloud fake of the contract, the cheapest (the local backends run them all;
    # contract/test_contract_spec.py's one test on sprites stays as it is)
    "contract/test_contract_commands.py::test_a_backend_reports_whether_it_can_run_here_and_closes_cleanly[sprites]",
    "contract/test_contract_commands.py::test_a_backend_reports_whether_it_can_run_here_and_closes_cleanly[e2b]",
    "contract/test_contract_checkpoints.py::test_a_spec_value_the_backend_cannot_honour_is_refused[sprites]",
    "contract/test_contract_checkpoints.py::test_a_spec_value_the_backend_cannot_honour_is_refused[e2b]",
    "contract/test_contract_tags.py::test_a_tagged_exec_runs_as_given_and_a_bad_tag_is_refused[sprites]",
    "contract/test_contract_tags.py::test_a_tagged_exec_runs_as_given_and_a_bad_tag_is_refused[e2b]",
)


def listed(rel: str, node: str, entries: tuple[str, ...]) -> bool:
    """Whether a file, a test or a test with all its parameters in ``entries`` names this one, or
    ``FILE::*[ID]`` every test of FILE with the parameter ID."""
    for entry in entries:
        file, _, test = entry.partition("::")
        if test.startswith("*["):
            if rel == file and node.endswith(test[1:]):
                return True
        elif rel == entry or node == entry or node.startswith(entry + "["):
            return True
    return False


def marks_for(item: pytest.Item) -> list[str]:
    rel = Path(str(item.path)).resolve().relative_to(TESTS).as_posix()
    top = rel.split("/", 1)[0]
    marks = list(BY_DIRECTORY.get(top, ()))
    if top not in NO_ROOT and rel not in NO_ROOT_FILES:
        marks.append("root")
    if any(p in item.name for p in CLOUD_PARAMETERS) and "fake_cloud" not in marks:
        marks.append("fake_cloud")
    node = f"{rel}::{item.name}"
    if listed(rel, node, SLOW) and not listed(rel, node, QUICK):
        marks.append("slow")
    return marks


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for name in marks_for(item):
            item.add_marker(name)
