"""The journal: durable appends, torn lines, concurrent writers, redaction and the story fold."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from hermes_sandboxes.recorder.journal import (
    MAX_FIELD_CHARS,
    AllowRecord,
    CheckpointDeleteRecord,
    CheckpointRecord,
    CreateRecord,
    DestroyRecord,
    ExecRecord,
    HealthCheck,
    Journal,
    RestoreRecord,
    command_text,
)
from hermes_sandboxes.recorder.state import HostState

# A writer that appends as fast as it can and acknowledges each append on stdout once append()
# has returned, so the parent knows which entries it was promised.
WRITER = textwrap.dedent(
    """
    import hashlib, os, sys
    from pathlib import Path
    from hermes_sandboxes.recorder.journal import ExecRecord, Journal

    path, tag, count, durable = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
    journal = Journal(path, durable=durable)
    i = 0
    while count < 0 or i < count:
        payload = f"{tag}-{i}-" + "x" * (i * 37 % 3000)
        digest = hashlib.sha256(payload.encode()).hexdigest()
        journal.append(ExecRecord(sandbox="s", command=payload, exit_code=i % 256, duration_s=0.5,
                                  origin={"tag": tag, "seq": str(i), "digest": digest}))
        print(i, flush=True)
        i += 1
    """
)


def spawn_writer(path: Path, tag: str, count: int = -1, durable: bool = True) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), tag, str(count), "1" if durable else "0"],
        stdout=subprocess.PIPE, text=True,
    )


def assert_intact(record: ExecRecord) -> None:
    assert hashlib.sha256(record.command.encode()).hexdigest() == record.origin["digest"]
    tag, seq = record.origin["tag"], int(record.origin["seq"])
    assert record.command.startswith(f"{tag}-{seq}-")
    assert record.exit_code == seq % 256


def exec_record(command: str, exit_code: int = 0, ts: float | None = None) -> ExecRecord:
    if ts is None:
        return ExecRecord(sandbox="box", command=command, exit_code=exit_code, duration_s=0.1)
    return ExecRecord(sandbox="box", command=command, exit_code=exit_code, duration_s=0.1, ts=ts)


def commands(records: list[ExecRecord] | tuple[ExecRecord, ...] | None) -> list[str]:
    assert records is not None
    return [r.command for r in records]


# -- durability ---------------------------------------------------------------------------------


def test_writers_killed_mid_stream_leave_a_readable_journal_with_every_acknowledged_entry(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.jsonl"
    rng = random.Random(3)
    acknowledged: set[tuple[str, int]] = set()
    injected_torn = 0
    for round_ in range(24):
        proc = spawn_writer(path, f"w{round_}", durable=round_ % 2 == 0)
        assert proc.stdout is not None
        acknowledged.add((f"w{round_}", int(proc.stdout.readline())))  # it is writing now
        threading.Event().wait(rng.uniform(0.0, 0.05))
        proc.send_signal(signal.SIGKILL)
        acknowledged.update((f"w{round_}", int(line)) for line in proc.stdout if line.strip())
        proc.wait()
        if round_ % 6 == 5:  # make sure of the worst case: a writer that died half-way through a line
            with open(path, "ab") as f:
                ends_clean = path.read_bytes().endswith(b"\n")  # a kill may have torn one already
                f.write((b"" if ends_clean else b"\n") + b'{"v":1,"ts":1.0,"sandbox":"s","type":"exec","command":"torn')
            injected_torn += 1

    records = Journal(path).records_of(ExecRecord)
    for record in records:
        assert_intact(record)
    present = [(r.origin["tag"], int(r.origin["seq"])) for r in records]
    assert len(present) == len(set(present)), "an entry was written twice"
    assert acknowledged <= set(present)
    # Every line is a whole entry or a torn one standing alone (a kill can cut a write short
    # between pages); a torn line is never glued to the entry that follows it.
    whole = 0
    for line in path.read_bytes().split(b"\n"):
        try:
            json.loads(line)
            whole += 1
        except ValueError:
            assert b"{\"v\":" not in line[1:]  # no entry starts inside another
    assert whole == len(records)
    torn = [line for line in path.read_bytes().split(b"\n") if b'"command":"torn' in line]
    assert len(torn) == injected_torn and all(line.endswith(b"torn") for line in torn)


def test_two_processes_writing_at_once_lose_and_interleave_nothing(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    writers = [spawn_writer(path, tag, count=500) for tag in ("a", "b")]
    for proc in writers:
        proc.communicate()
        assert proc.returncode == 0

    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) - 1 == 1000
    for line in lines[:-1]:
        json.loads(line)  # every line is one whole entry
    records = Journal(path).records_of(ExecRecord)
    for tag in ("a", "b"):
        mine = [r for r in records if r.origin["tag"] == tag]
        assert [int(r.origin["seq"]) for r in mine] == list(range(500))
        for record in mine:
            assert_intact(record)


def test_threads_sharing_one_journal_do_not_interleave(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.jsonl", durable=False)

    def write(tag: str) -> None:
        for i in range(200):
            journal.append(exec_record(f"{tag}-{i}-" + "y" * 5000))

    threads = [threading.Thread(target=write, args=(f"t{n}",)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = journal.path.read_bytes().split(b"\n")
    assert len(lines) - 1 == 800 and len(journal.records()) == 800


def _append_from_fork(journal: Journal, tag: str) -> None:
    for i in range(100):
        journal.append(exec_record(f"{tag}-{i}-" + "z" * 3000))


def test_a_forked_child_takes_its_own_lock(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.jsonl", durable=False)
    journal.append(exec_record("before the fork"))  # the parent holds an open descriptor now
    ctx = multiprocessing.get_context("fork")
    children = [ctx.Process(target=_append_from_fork, args=(journal, f"c{n}")) for n in range(2)]
    for child in children:
        child.start()
    _append_from_fork(journal, "parent")
    for child in children:
        child.join()
        assert child.exitcode == 0
    assert len(journal.records()) == 301
    assert all(line.startswith(b"{") for line in journal.path.read_bytes().split(b"\n")[:-1])


def test_a_new_journal_file_is_private_to_its_owner(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "deep" / "dir" / "j.jsonl")
    journal.append(CreateRecord(sandbox="box"))
    assert (os.stat(journal.path).st_mode & 0o777) == 0o600


# -- torn and invalid lines ---------------------------------------------------------------------


def test_the_next_writer_isolates_a_torn_line(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.jsonl")
    journal.append(exec_record("first"))
    with open(journal.path, "ab") as f:
        f.write(b'{"v":1,"ts":2.0,"sandbox":"box","type":"exec","command":"half')
    assert commands(journal.records_of(ExecRecord)) == ["first"]

    journal.append(exec_record("second"))
    assert commands(journal.records_of(ExecRecord)) == ["first", "second"]
    lines = journal.path.read_bytes().split(b"\n")
    assert lines[1].endswith(b'"half') and json.loads(lines[2])["command"] == "second"


def test_an_unterminated_last_line_is_not_read_even_when_it_parses(tmp_path: Path) -> None:
    # A writer in the middle of its write(): the line is not an entry until its newline lands.
    path = tmp_path / "j.jsonl"
    line = json.dumps(exec_record("in flight").to_dict())
    path.write_text(line)
    assert Journal(path).records() == []
    path.write_text(line + "\n")
    assert commands(Journal(path).records_of(ExecRecord)) == ["in flight"]


def test_garbage_lines_are_skipped_without_raising(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    good = json.dumps(exec_record("kept").to_dict())
    bad = [
        b"\x00\x00\x00\x00",
        b"\xff\xfe not utf-8",
        b"[1, 2, 3]",
        b'"a string"',
        b"{" * 100_000,  # deep enough to hit the recursion limit
        b'{"v":1,"ts":1.0,"sandbox":"box","type":"teleport"}',
        b'{"v":1,"ts":"noon","sandbox":"box","type":"destroy"}',
        b'{"v":1,"ts":1.0,"sandbox":"box","type":"exec","command":"x","exit_code":true,"duration_s":1}',
        b'{"v":1,"ts":1.0,"sandbox":"box","type":"checkpoint","id":"c","trigger":"whim"}',
        b'{"v":1,"ts":1.0,"sandbox":"box","type":"restore","id":"c"}',
        b"",
    ]
    path.write_bytes(b"\n".join([*bad, good.encode(), b""]))
    assert commands(Journal(path).records_of(ExecRecord)) == ["kept"]


def test_a_missing_journal_reads_as_empty(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "nowhere" / "j.jsonl")
    assert journal.records() == []
    assert journal.story().checkpoints == {}
    assert journal.commands_since("anything") is None


def test_a_newer_schema_version_is_read_as_far_as_its_fields_go(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    data = {**exec_record("future").to_dict(), "v": 7, "cpu_seconds": 3.5}
    path.write_text(json.dumps(data) + "\n")
    assert commands(Journal(path).records_of(ExecRecord)) == ["future"]


# -- what gets written --------------------------------------------------------------------------


def test_every_kind_of_record_reads_back_as_written(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.jsonl")
    written = [
        journal.append(CreateRecord(sandbox="box", backend="local", ephemeral=False)),
        journal.append(ExecRecord(sandbox="box", command="make test", exit_code=2, duration_s=1.5,
                                  timed_out=True, origin={"task": "t-1", "session": "s-9"})),
        journal.append(ExecRecord(sandbox="box", command="nope", exit_code=None, duration_s=0.0,
                                  error="connection lost")),
        journal.append(CheckpointRecord(
            sandbox="box", id="cp1", comment="green", trigger="auto", trigger_command="rm -rf build",
            layer_bytes=4096, health=HealthCheck("pytest -q", 0, True, "3 passed"))),
        journal.append(RestoreRecord(sandbox="box", id="cp1", discarded=3)),
        journal.append(CheckpointDeleteRecord(sandbox="box", id="cp1", reason="retention")),
        journal.append(AllowRecord(sandbox="box", allow=("@pypi", "127.0.0.1:8080"), previous=("@pypi",))),
        journal.append(AllowRecord(sandbox="box", allow=())),
        journal.append(DestroyRecord(sandbox="box")),
    ]
    assert journal.records() == written
    raw = list(journal.raw())
    assert [r["type"] for r in raw] == ["create", "exec", "exec", "checkpoint", "restore",
                                        "checkpoint_delete", "allow", "allow", "destroy"]
    assert all(r["v"] == 1 and isinstance(r["ts"], float) and r["sandbox"] == "box" for r in raw)


def test_records_can_be_read_for_one_sandbox_of_a_shared_audit_log(tmp_path: Path) -> None:
    audit = Journal(tmp_path / "audit.jsonl")
    audit.append(ExecRecord(sandbox="one", command="ls", exit_code=0, duration_s=0.1))
    audit.append(ExecRecord(sandbox="two", command="pwd", exit_code=0, duration_s=0.1))
    assert commands(audit.records_of(ExecRecord, sandbox="two")) == ["pwd"]


def test_redaction_reaches_every_free_text_field(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.jsonl", redact=lambda s: s.replace("hunter2", "[REDACTED]"))
    stored = journal.append(ExecRecord(
        sandbox="box", command="curl -u me:hunter2 https://x", exit_code=0, duration_s=0.1,
        origin={"session": "hunter2-session"}, error="auth hunter2 failed"))
    journal.append(CheckpointRecord(
        sandbox="box", id="cp1", comment="token hunter2", trigger="manual",
        health=HealthCheck("check --key hunter2", 1, False, "...hunter2\n")))
    text = journal.path.read_text()
    assert "hunter2" not in text and text.count("[REDACTED]") == 6
    assert stored.command == "curl -u me:[REDACTED] https://x"  # append returns what was stored
    checkpoint = journal.records_of(CheckpointRecord)[0]
    assert checkpoint.id == "cp1" and checkpoint.health is not None and not checkpoint.health.passed


def test_redaction_reaches_strings_at_any_depth_and_leaves_other_values_as_they_are(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.jsonl", redact=lambda s: s.replace("hunter2", "[REDACTED]"))
    ran = journal.append(ExecRecord(sandbox="box", command="echo hunter2", exit_code=None, duration_s=0.25,
                                    timed_out=True, killed=False))
    allowed = journal.append(AllowRecord(sandbox="box", allow=("hunter2.example", "pypi.org"), previous=None))
    checked = journal.append(CheckpointRecord(sandbox="box", id="cp1", comment="", trigger="manual",
                                              health=HealthCheck("check hunter2", 1, False, "hunter2\n")))
    assert "hunter2" not in journal.path.read_text()
    assert (ran.command, ran.exit_code, ran.duration_s, ran.timed_out, ran.killed) == (
        "echo [REDACTED]", None, 0.25, True, False)
    assert (allowed.allow, allowed.previous) == (("[REDACTED].example", "pypi.org"), None)
    assert checked.health is not None and (checked.health.command, checked.health.exit_code, checked.health.passed) == (
        "check [REDACTED]", 1, False)
    assert journal.records() == [ran, allowed, checked]


def test_long_fields_are_clipped_after_redaction(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.jsonl", redact=lambda s: s.replace("SECRET", "*"))
    stored = journal.append(exec_record("echo " + "a" * (2 * MAX_FIELD_CHARS) + "SECRET"))
    assert len(stored.command) < MAX_FIELD_CHARS + 40 and "truncated" in stored.command
    assert "SECRET" not in journal.path.read_text()


def test_paths_and_command_text_conventions(tmp_path: Path) -> None:
    state = HostState(tmp_path)
    assert state.journal_path("local-abc", "my-box") == tmp_path / "local-abc" / "journals" / "my-box.jsonl"
    assert state.audit_path("local-abc") == tmp_path / "local-abc" / "audit.jsonl"
    assert command_text(["echo", "two words"]) == "echo 'two words'"
    with pytest.raises(Exception, match="invalid sandbox name"):
        state.journal_path("local-abc", "../escape")
    with pytest.raises(Exception, match="cannot name a directory"):
        state.audit_path("../up")


# -- the story ----------------------------------------------------------------------------------


def checkpoint(cid: str, trigger: str = "manual") -> CheckpointRecord:
    return CheckpointRecord(sandbox="box", id=cid, trigger=trigger)  # type: ignore[arg-type]


def test_each_checkpoint_tells_the_commands_since_the_previous_one(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.jsonl", durable=False)
    for record in [exec_record("apt-get update"), checkpoint("c1"), exec_record("make", 2),
                   exec_record("make clean"), checkpoint("c2", "auto"), exec_record("ls")]:
        journal.append(record)
    story = journal.story()
    assert list(story.checkpoints) == ["c1", "c2"]
    c1, c2 = story.checkpoints["c1"], story.checkpoints["c2"]
    assert c1.previous is None and commands(c1.commands) == ["apt-get update"]
    assert c2.previous == "c1" and commands(c2.commands) == ["make", "make clean"]
    assert [c.exit_code for c in c2.commands] == [2, 0] and c2.record.trigger == "auto"
    assert commands(story.commands_since("c1")) == ["make", "make clean", "ls"]
    assert commands(story.commands_since("c2")) == ["ls"]


def test_after_a_restore_only_later_commands_count_as_since(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.jsonl", durable=False)
    for record in [checkpoint("c1"), exec_record("a"), checkpoint("c2"), exec_record("b"),
                   RestoreRecord(sandbox="box", id="c1", discarded=2), exec_record("c")]:
        journal.append(record)
    story = journal.story()
    assert commands(story.commands_since("c1")) == ["c"]
    # c2's state has "a"; the current one has "c" instead: going back to c2 throws away only "c".
    assert commands(story.commands_since("c2")) == ["c"]

    journal.append(checkpoint("c3"))
    journal.append(exec_record("d"))
    story = journal.story()
    assert story.checkpoints["c3"].previous == "c1"
    assert commands(story.checkpoints["c3"].commands) == ["c"]
    assert commands(story.commands_since("c1")) == ["c", "d"]
    assert commands(story.commands_since("c3")) == ["d"]
    assert [r.id for r in story.restores] == ["c1"]


def test_restoring_a_checkpoint_from_a_discarded_branch(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.jsonl", durable=False)
    for record in [checkpoint("c1"), exec_record("a"), checkpoint("c2"), exec_record("b"),
                   RestoreRecord(sandbox="box", id="c1", discarded=2), exec_record("c"),
                   RestoreRecord(sandbox="box", id="c2", discarded=1), exec_record("d")]:
        journal.append(record)
    story = journal.story()
    assert commands(story.commands_since("c2")) == ["d"]
    assert commands(story.commands_since("c1")) == ["a", "d"]


def test_a_checkpoint_the_journal_never_saw_uses_its_creation_time(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.jsonl", durable=False)
    for record in [exec_record("old", ts=100.0), exec_record("new", ts=200.0)]:
        journal.append(record)
    story = journal.story()
    assert story.commands_since("external") is None
    assert commands(story.commands_since("external", created_at=150.0)) == ["new"]

    journal.append(RestoreRecord(sandbox="box", id="external", discarded=1))
    journal.append(exec_record("after", ts=300.0))
    assert commands(journal.commands_since("external")) == ["after"]


def test_deleted_checkpoints_keep_their_story_and_destroy_starts_a_new_one(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.jsonl", durable=False)
    for record in [exec_record("a"), checkpoint("c1", "auto"),
                   CheckpointDeleteRecord(sandbox="box", id="c1", reason="retention")]:
        journal.append(record)
    told = journal.story().checkpoints["c1"]
    assert told.deleted is not None and told.deleted.reason == "retention"
    assert commands(told.commands) == ["a"]

    journal.append(DestroyRecord(sandbox="box"))
    journal.append(CreateRecord(sandbox="box"))
    journal.append(exec_record("fresh"))
    journal.append(checkpoint("c1"))
    story = journal.story()
    assert commands(story.checkpoints["c1"].commands) == ["fresh"]
    assert story.checkpoints["c1"].deleted is None
