"""The hermes-sandboxes checkpoint commands (create, list, show, diff, restore, rm) and ``log``, run
for real against the local backend on the session's store; fixtures and helpers in cli_kit.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hermes_sandboxes.backends.local import LocalBackend, LocalSandbox
from hermes_sandboxes.names import unique_name
from hermes_sandboxes.recorder.state import HostState
from tests.cli import cli_kit
from tests.cli.cli_kit import CLI, Pty, as_json, assert_one_line_error, checkpoint_ids, hs, ok, state

home, box = cli_kit.home, cli_kit.box  # the shared fixtures, under the names the tests ask for


# -- checkpoints ---------------------------------------------------------------------------------


def test_checkpoint_create_prints_only_the_id_on_stdout(home: Path, box: LocalSandbox) -> None:
    result = ok(home, "checkpoint", "create", box.name, "-m", "first")
    assert checkpoint_ids(home, box.name) == [result.stdout.strip()]


def test_checkpoint_list_tells_the_story_newest_first(home: Path, box: LocalSandbox) -> None:
    first = ok(home, "checkpoint", "create", box.name, "-m", "empty").stdout.strip()
    ok(home, "exec", box.name, "--", "echo one")
    assert hs(home, "exec", box.name, "--", "exit 2").exit_code == 2
    second = ok(home, "checkpoint", "create", box.name, "-m", "after two commands").stdout.strip()
    listed = as_json(home, "checkpoint", "list", box.name)
    assert [c["id"] for c in listed] == [second, first]
    assert set(listed[0]) == {"id", "created_at", "comment", "trigger", "trigger_command", "previous", "commands",
                              "health", "layer_bytes", "journaled"}
    story = listed[0]
    assert story["trigger"] == "manual" and story["previous"] == first
    assert [(c["command"], c["exit_code"]) for c in story["commands"]] == [("echo one", 0), ("exit 2", 2)]
    plain = ok(home, "checkpoint", "list", box.name).stdout.splitlines()
    assert plain[0].split() == ["ID", "AGE", "TRIGGER", "COMMENT", "COMMANDS", "SIZE", "HEALTH"]
    assert plain[1].startswith(second) and "after two commands" in plain[1] and " manual " in plain[1]
    assert plain[1].split()[-4] == "2"  # commands since the previous checkpoint
    assert plain[2].startswith(first)


def test_checkpoint_show_gives_the_details_and_the_commands_before_it(home: Path, box: LocalSandbox) -> None:
    ok(home, "exec", box.name, "--", "echo building")
    taken = ok(home, "checkpoint", "create", box.name, "-m", "built").stdout.strip()
    shown = ok(home, "checkpoint", "show", box.name, taken).stdout
    assert taken in shown and "built" in shown and "manual" in shown and "echo building" in shown
    assert as_json(home, "checkpoint", "show", box.name, taken)["id"] == taken


def test_checkpoint_diff_summarises_by_directory_and_lists_files_with_full(home: Path, box: LocalSandbox) -> None:
    ok(home, "exec", box.name, "--", "mkdir -p /srv/a && echo 1 > /srv/a/one && echo 0 > /srv/a/gone")
    taken = ok(home, "checkpoint", "create", box.name).stdout.strip()
    ok(home, "exec", box.name, "--checkpoint", "off", "--",
       "echo 22 > /srv/a/two; echo 333 > /srv/a/one; rm /srv/a/gone")
    summary = ok(home, "checkpoint", "diff", box.name, taken).stdout
    assert "/srv/a" in summary and "total" in summary
    full = ok(home, "checkpoint", "diff", box.name, taken, "--full").stdout
    assert "+  /srv/a/two" in full and "~  /srv/a/one" in full and "-  /srv/a/gone" in full
    data = as_json(home, "checkpoint", "diff", box.name, taken, "--full")
    assert data["from"] == taken and data["to"] is None
    assert data["summary"]["total"]["added"] == 1 and data["summary"]["total"]["modified"] == 1
    assert data["summary"]["total"]["deleted"] == 1
    assert {c["path"]: c["kind"] for c in data["changes"]} == {
        "/srv/a/two": "added", "/srv/a/one": "modified", "/srv/a/gone": "deleted"}
    assert "changes" not in as_json(home, "checkpoint", "diff", box.name, taken)


def test_checkpoint_diff_compares_two_checkpoints(home: Path, box: LocalSandbox) -> None:
    first = ok(home, "checkpoint", "create", box.name).stdout.strip()
    ok(home, "exec", box.name, "--", "echo x > /root/new")
    second = ok(home, "checkpoint", "create", box.name).stdout.strip()
    ok(home, "exec", box.name, "--", "echo y > /root/later")
    data = as_json(home, "checkpoint", "diff", box.name, first, second, "--full")
    assert [c["path"] for c in data["changes"]] == ["/root/new"]
    assert "no changes" in ok(home, "checkpoint", "diff", box.name, second, second).stdout


def test_a_diff_from_a_checkpoint_taken_before_any_command_shows_only_the_commands_changes(
        home: Path, box: LocalSandbox) -> None:
    taken = ok(home, "checkpoint", "create", box.name).stdout.strip()
    ok(home, "exec", box.name, "--", "echo x > /root/new")
    data = as_json(home, "checkpoint", "diff", box.name, taken, "--full")
    assert [c["path"] for c in data["changes"]] == ["/root/new"]


def test_a_diff_gives_the_size_of_a_deleted_base_file(home: Path, box: LocalSandbox) -> None:
    ok(home, "exec", box.name, "--", "true")
    taken = ok(home, "checkpoint", "create", box.name).stdout.strip()
    ok(home, "exec", box.name, "--checkpoint", "off", "--", "rm /usr/bin/git")
    [change] = as_json(home, "checkpoint", "diff", box.name, taken, "--full")["changes"]
    assert change["path"] == "/usr/bin/git" and change["old_size"] == os.path.getsize("/usr/bin/git")


def test_checkpoint_restore_shows_what_it_discards_then_restores(home: Path, box: LocalSandbox) -> None:
    ok(home, "exec", box.name, "--", "echo v1 > /root/state")
    taken = ok(home, "checkpoint", "create", box.name, "-m", "v1").stdout.strip()
    ok(home, "exec", box.name, "--checkpoint", "off", "--", "echo v2 > /root/state; rm /usr/bin/git")
    result = ok(home, "checkpoint", "restore", box.name, taken, "--yes")
    assert "throws away" in result.stdout and "echo v2 > /root/state; rm /usr/bin/git" in result.stdout
    # --yes takes no diff (issue 24: a hostile tree must not hold an undo back); it says where the files are
    assert f"file changes: unknown (not counted with --yes; hermes-sandboxes checkpoint diff {box.name} {taken}" \
        in result.stdout and "file changes since the checkpoint" not in result.stdout
    assert f"restored {box.name} to {taken}" in result.stderr
    assert ok(home, "exec", box.name, "--", "cat /root/state; git --version >/dev/null && echo git").stdout == \
        "v1\ngit\n"


def test_checkpoint_restore_asks_on_a_terminal_and_declining_changes_nothing(
        home: Path, box: LocalSandbox) -> None:
    taken = ok(home, "checkpoint", "create", box.name).stdout.strip()
    ok(home, "exec", box.name, "--", "echo after > /root/after")
    before = state(home, box.name)
    term = Pty([*CLI, "--home", str(home), "checkpoint", "restore", box.name, taken])
    term.expect(b"file changes since the checkpoint")  # asked, it counts the files
    term.expect(b"echo after > /root/after")  # the preview comes before the question
    term.expect(b"[y/N]")
    term.send(b"n\r")
    assert term.finish() == 1 and b"restore cancelled" in term.seen
    assert state(home, box.name) == before
    assert box.read_file("/root/after") == b"after\n"
    term = Pty([*CLI, "--home", str(home), "checkpoint", "restore", box.name, taken])
    term.expect(b"[y/N]")
    term.send(b"y\r")
    assert term.finish() == 0
    assert hs(home, "exec", box.name, "--", "test -e /root/after").exit_code == 1


def test_checkpoint_rm_deletes_only_that_checkpoint(home: Path, box: LocalSandbox) -> None:
    first = ok(home, "checkpoint", "create", box.name).stdout.strip()
    second = ok(home, "checkpoint", "create", box.name).stdout.strip()
    ok(home, "checkpoint", "rm", box.name, first, "--yes")
    assert checkpoint_ids(home, box.name) == [second]


@pytest.mark.parametrize("command", [["restore", "{name}", "{id}"], ["rm", "{name}", "{id}"]])
def test_destructive_checkpoint_commands_refuse_without_yes_when_stdin_is_not_a_terminal(
        home: Path, box: LocalSandbox, command: list[str]) -> None:
    taken = ok(home, "checkpoint", "create", box.name).stdout.strip()
    ok(home, "exec", box.name, "--", "echo after > /root/after")
    before = state(home, box.name)
    result = hs(home, "checkpoint", *(p.format(name=box.name, id=taken) for p in command), input="y\n")
    assert_one_line_error(result, exit_code=2, says="add --yes")
    assert state(home, box.name) == before
    assert box.read_file("/root/after") == b"after\n"


def test_checkpoint_rm_on_a_terminal_shows_the_checkpoint_and_asks(home: Path, box: LocalSandbox) -> None:
    taken = ok(home, "checkpoint", "create", box.name, "-m", "keep me").stdout.strip()
    term = Pty([*CLI, "--home", str(home), "checkpoint", "rm", box.name, taken])
    term.expect(b"keep me")
    term.expect(b"[y/N]")
    term.send(b"n\r")
    assert term.finish() == 1 and b"cancelled" in term.seen
    assert checkpoint_ids(home, box.name) == [taken]


@pytest.mark.parametrize("command", [
    ["show", "{name}", "ck-deadbeef"],
    ["diff", "{name}", "ck-deadbeef"],
    ["diff", "{name}", "{real}", "ck-deadbeef"],
    ["restore", "{name}", "ck-deadbeef", "--yes"],
    ["rm", "{name}", "ck-deadbeef"],
])
def test_an_unknown_checkpoint_fails_in_one_line_and_changes_nothing(
        home: Path, box: LocalSandbox, command: list[str]) -> None:
    real = ok(home, "checkpoint", "create", box.name).stdout.strip()
    ok(home, "exec", box.name, "--", "echo since > /root/since")
    before = state(home, box.name)
    args = [part.format(name=box.name, real=real) for part in command]
    assert_one_line_error(hs(home, "checkpoint", *args), exit_code=1, says="ck-deadbeef")
    assert state(home, box.name) == before
    assert box.read_file("/root/since") == b"since\n"


# -- log ------------------------------------------------------------------------------------------


def test_log_shows_the_audit_trail_oldest_first(home: Path) -> None:
    name = unique_name("cli")
    ok(home, "create", name)
    try:
        assert hs(home, "exec", name, "--", "exit 5").exit_code == 5
        taken = ok(home, "checkpoint", "create", name, "-m", "marked").stdout.strip()
        ok(home, "checkpoint", "restore", name, taken, "--yes")
        ok(home, "checkpoint", "rm", name, taken, "--yes")
        records = as_json(home, "log", name)
        assert [r["type"] for r in records] == ["create", "exec", "checkpoint", "restore", "checkpoint_delete"]
        assert records[1]["command"] == "exit 5" and records[1]["exit_code"] == 5
        assert records[2]["id"] == taken and records[2]["comment"] == "marked"
        plain = ok(home, "log", name).stdout.splitlines()
        assert plain[0].split() == ["TIME", "EVENT", "EXIT", "TOOK", "DETAIL"]
        assert "exit 5" in plain[2] and f"{taken} [manual] marked" in plain[3]
    finally:
        ok(home, "rm", name, "--yes")
    assert as_json(home, "log", name)[-1]["type"] == "destroy"  # the history outlives the sandbox


def test_secrets_passed_with_env_never_reach_the_audit_log(home: Path, box: LocalSandbox) -> None:
    secret = "s3cr3t-" + unique_name("v")
    result = ok(home, "exec", box.name, "--env", f"API_TOKEN={secret}", "--", f"test $API_TOKEN = {secret}")
    assert result.exit_code == 0
    audit = HostState().audit_path(LocalBackend(home).key).read_text()
    assert secret not in audit and "REDACTED" in audit


def test_checkpoint_create_with_a_health_command_keeps_its_result_in_the_story(
        home: Path, box: LocalSandbox) -> None:
    result = hs(home, "checkpoint", "create", box.name, "--health", "test -f /root/ok")
    failed = result.stdout.strip()  # the checkpoint is kept, its id printed, and the failure said: exit 1
    assert result.exit_code == 1 and "health check FAILED (exit 1): test -f /root/ok" in result.stderr
    ok(home, "exec", box.name, "--", "touch /root/ok")
    passed = ok(home, "checkpoint", "create", box.name, "--health", "test -f /root/ok").stdout.strip()
    story = {c["id"]: c["health"] for c in as_json(home, "checkpoint", "list", box.name)}
    assert (story[failed]["passed"], story[failed]["exit_code"]) == (False, 1)
    assert (story[passed]["passed"], story[passed]["command"]) == (True, "test -f /root/ok")
    assert "passed: test -f /root/ok" in ok(home, "checkpoint", "show", box.name, passed).stdout
    rows = {line.split()[0]: line.split()[-1] for line in ok(home, "checkpoint", "list", box.name).stdout.splitlines()}
    assert (rows[failed], rows[passed]) == ("FAILED", "passed")


def test_a_hung_health_command_is_killed_at_its_timeout_and_counts_as_failed(home: Path, box: LocalSandbox) -> None:
    result = hs(home, "checkpoint", "create", box.name, "--health", "sleep 600", "--health-timeout", "1")
    assert result.exit_code == 1 and "health check FAILED (timed out)" in result.stderr, result.stderr
    [taken] = as_json(home, "checkpoint", "list", box.name)
    assert taken["health"]["passed"] is False and taken["id"] == result.stdout.strip()
    assert ok(home, "exec", box.name, "--", "pgrep -x sleep || echo none").stdout == "none\n"
