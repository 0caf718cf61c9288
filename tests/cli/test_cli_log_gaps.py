"""``log`` shows what either file of the record holds: the recorder appends each record to the
sandbox's journal and then to the audit log, and a kill -9 can fall between the two writes.

Each test leaves the files exactly as such a kill leaves them (the journal's last record, the audit
log without it): a real CLI call writes both, then the audit log loses its last line(s). The
sweep in test_cli_kill9 reaches the same states by killing at random points (it failed once in CI
on one: a command written ahead to the journal, killed before its audit line, missing from ``log``).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from hermes_sandboxes.backends.local import LocalSandbox
from hermes_sandboxes.recorder.journal import Journal
from hermes_sandboxes.recorder.sandbox import RecordedSandbox
from hermes_sandboxes.recorder.state import HostState
from tests.cli import cli_kit
from tests.cli.cli_kit import CLI, as_json, ok

home, box = cli_kit.home, cli_kit.box


def drop_last_lines(path: Path, count: int) -> list[bytes]:
    """Remove the last ``count`` lines of ``path`` (as if their writer died before them); returns them."""
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-count]))
    return lines[-count:]


def paths(box: LocalSandbox) -> tuple[Path, Path]:
    state = HostState()
    return state.journal_path(box.backend.key, box.name), state.audit_path(box.backend.key)


def commands(home: Path, name: str) -> list[dict[str, Any]]:
    return [r for r in as_json(home, "log", name) if r["type"] == "exec"]


def test_a_command_whose_end_reached_only_the_journal_is_logged_with_its_exit_code(
        home: Path, box: LocalSandbox) -> None:
    ok(home, "exec", box.name, "--", "exit 0")
    _, audit = paths(box)
    [end] = drop_last_lines(audit, 1)
    assert b'"type":"exec"' in end, end
    [logged] = commands(home, box.name)
    assert logged["exit_code"] == 0 and not logged.get("unfinished") and not logged.get("lost"), logged


def test_a_command_written_ahead_only_to_the_journal_is_logged_lost_and_settled_once(
        home: Path, box: LocalSandbox) -> None:
    # in its own process, which is gone when we look (a command of ours would be running, not lost)
    subprocess.run([*CLI, "--home", str(home), "exec", box.name, "--", "echo one"], check=True,
                   capture_output=True, timeout=120)
    journal, audit = paths(box)
    # its CLI died after writing the start to the journal: neither log has its end, the audit no start
    assert b'"type":"exec"' in drop_last_lines(journal, 1)[0]
    assert [b'"type":"exec_start"' in line for line in drop_last_lines(audit, 2)] == [True, False]
    [lost] = commands(home, box.name)
    assert lost["command"] == "echo one" and lost["lost"] and lost["exit_code"] is None, lost
    assert "recorded lost commands" in ok(home, "gc").stderr
    [settled] = commands(home, box.name)
    assert settled["lost"] and not settled.get("unfinished") and settled["id"] == lost["id"], settled
    assert "recorded lost commands" not in ok(home, "gc").stderr


def test_a_restore_recorded_only_in_the_journal_is_logged(home: Path, box: LocalSandbox) -> None:
    taken = ok(home, "checkpoint", "create", box.name).stdout.strip()
    ok(home, "exec", box.name, "--", "touch /root/later")
    ok(home, "checkpoint", "restore", box.name, taken, "--yes")
    _, audit = paths(box)
    [end] = drop_last_lines(audit, 1)
    assert b'"type":"restore"' in end, end
    logged = as_json(home, "log", box.name)
    assert [r["id"] for r in logged if r["type"] == "restore"] == [taken], logged
    assert not any(r["type"] == "restore_start" for r in logged), logged
    # once: the records both files hold are not shown twice
    assert [r["type"] for r in logged].count("checkpoint") == 1, logged


def test_log_shows_the_agent_session_that_sent_a_command(home: Path, box: LocalSandbox) -> None:
    """A command recorded with a session id (as the Hermes plugin records each of the agent's) shows
    it in the text form as in --json; one without shows none."""
    journal, audit = paths(box)
    recorded = RecordedSandbox(box, Journal(journal), Journal(audit),
                               origin={"via": "hermes", "task": "t1", "session": "20261203_074500_ab12cd"})
    assert recorded.exec("echo agent").exit_code == 0
    ok(home, "exec", box.name, "--", "echo by-hand")
    agent, by_hand = commands(home, box.name)
    assert agent["origin"]["session"] == "20261203_074500_ab12cd" and "session" not in by_hand.get("origin", {})
    lines = ok(home, "log", box.name).stdout.splitlines()
    [agent_line] = [line for line in lines if "echo agent" in line]
    [by_hand_line] = [line for line in lines if "echo by-hand" in line]
    assert "[session 20261203_074500_ab12cd]" in agent_line, lines
    assert "session" not in by_hand_line, lines
