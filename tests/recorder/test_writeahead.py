"""Commands are written ahead: the record knows a command may have run before it starts, and says
honestly what became of one whose end was never recorded (still running, or lost with the process
that recorded it). Journal-level tests with real processes for liveness and races, and the
recorder against the real local backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from hermes_sandboxes.backends.local import LocalBackend
from hermes_sandboxes.recorder import liveness
from hermes_sandboxes.recorder.journal import (
    AbandonedRecord,
    CheckpointRecord,
    CheckpointStartRecord,
    ExecRecord,
    ExecStartRecord,
    Journal,
    RestoreRecord,
    RestoreStartRecord,
)
from hermes_sandboxes.recorder.sandbox import RecordedSandbox
from hermes_sandboxes.recorder.state import HostState
from hermes_sandboxes.recorder.story import as_shown, fold_story
from hermes_sandboxes.recorder.writeahead import Markers
from hermes_sandboxes.sandbox import Sandbox


def dead_process() -> liveness.ProcessIdentity:
    """The identity of a real process that has exited since (its pid may be reused: the start time
    tells them apart)."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    identity = liveness.ProcessIdentity(child.pid, liveness.start_time(child.pid), liveness.boot_id())
    assert identity.start is not None
    child.communicate(b"")
    return identity


def start(command: str, owner: liveness.ProcessIdentity | None, **fields: object) -> ExecStartRecord:
    return ExecStartRecord(sandbox="box", id=os.urandom(6).hex(), command=command, owner=owner, **fields)  # type: ignore[arg-type]


def test_liveness_tells_a_live_process_from_a_dead_one_and_from_a_reused_pid() -> None:
    me = liveness.current()
    assert liveness.alive(me) and me.boot == liveness.boot_id()
    assert not liveness.alive(dead_process())
    assert not liveness.alive(liveness.ProcessIdentity(me.pid, "1", me.boot))  # same pid, other start
    assert not liveness.alive(liveness.ProcessIdentity(me.pid, me.start, "another-boot"))
    assert liveness.ProcessIdentity.from_dict(me.to_dict()) == me
    assert liveness.ProcessIdentity.from_dict({"pid": True, "start": "1"}) is None


def test_a_start_record_keeps_any_bytes_and_reads_back_as_written(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.jsonl")
    raw = "printf 'caf\udce9 \x1b[31m'"  # an invalid UTF-8 byte (surrogate-escaped) and an escape
    stored = journal.append(start(raw, liveness.current(), cwd="/root/d\udcff", checkpoint="ck-1",
                                  origin={"task": "t"}, internal=True))
    assert stored.command == "printf 'caf\\xe9 \x1b[31m'" and stored.cwd == "/root/d\\xff"
    assert journal.records() == [stored] and stored.owner == liveness.current()
    line = json.loads(journal.path.read_bytes())
    assert line["type"] == "exec_start" and line["owner"]["pid"] == liveness.current().pid


def test_a_command_with_no_end_is_running_while_its_recorder_lives_and_lost_once_it_died() -> None:
    records = [start("alive", liveness.current()), start("dead", dead_process()), start("unknown", None)]
    story = fold_story(records)
    shown = {r.command: r for r in story.commands_since("ck-x", created_at=0.0) or []}
    assert shown["alive"].unfinished and not shown["alive"].lost and "still running" in (shown["alive"].error or "")
    for name in ("dead", "unknown"):
        assert shown[name].unfinished and shown[name].lost and shown[name].exit_code is None
        assert (shown[name].error or "").startswith("lost: the process recording it")
    assert [e.command for e in story.lost()] == ["dead", "unknown"]  # never the live recorder's


def test_an_ended_command_appears_once_at_its_end_even_when_two_processes_settled_it() -> None:
    first = start("make", dead_process())
    checkpoint = CheckpointRecord(sandbox="box", id="ck-1")
    end = first.ended(lost=True, error="lost")
    story = fold_story([first, checkpoint, end, end])  # ended after the checkpoint: it counts after it
    assert story.open == {} and story.lost() == []
    assert [c.command for c in story.commands_since("ck-1") or []] == ["make"]
    assert as_shown([first, checkpoint, end]) == [checkpoint, end]
    [shown] = as_shown([first])
    assert isinstance(shown, ExecRecord) and shown.unfinished and shown.ts == first.ts


def test_internal_starts_stay_out_of_the_story_unless_asked_for() -> None:
    records = [start("hermes-snapshot", liveness.current(), internal=True)]
    assert fold_story(records).commands_since("x", created_at=0.0) == []
    assert len(fold_story(records, include_internal=True).commands_since("x", created_at=0.0) or []) == 1


WRITER = textwrap.dedent("""
    import sys
    from hermes_sandboxes.recorder import liveness
    from hermes_sandboxes.recorder.journal import ExecStartRecord, Journal
    journal, tag = Journal(sys.argv[1], durable=False), sys.argv[2]
    for i in range(int(sys.argv[3])):
        begun = journal.append(ExecStartRecord(sandbox="box", id=f"{tag}-{i}", command=f"{tag} {i}",
                                               owner=liveness.current()))
        journal.append(begun.ended(error="done"))
""")
SETTLER = textwrap.dedent("""
    import os, sys
    from hermes_sandboxes.recorder.journal import Journal
    journal, stop, settled, rounds = Journal(sys.argv[1], durable=False), sys.argv[2], 0, 0
    while True:
        last = os.path.exists(stop)
        ends = journal.story(include_internal=True).lost()
        for end in ends:
            journal.append(end)
        settled, rounds = settled + len(ends), rounds + 1
        if last:
            break
    print(settled, rounds)
""")


def test_settling_beside_two_live_writers_settles_only_the_dead_ones(tmp_path: Path) -> None:
    path, stop = tmp_path / "j.jsonl", tmp_path / "stop"
    journal = Journal(path, durable=False)
    for n in range(3):  # left by a recorder that died (kill -9) before writing their ends
        journal.append(start(f"orphan-{n}", dead_process()))
    settler = subprocess.Popen([sys.executable, "-c", SETTLER, str(path), str(stop)], stdout=subprocess.PIPE,
                               text=True)
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), tag, "150"]) for tag in ("a", "b")]
    assert all(w.wait(timeout=120) == 0 for w in writers)
    stop.touch()
    out, _ = settler.communicate(timeout=120)
    settled, rounds = map(int, out.split())
    assert settled == 3 and rounds > 1, out  # the dead recorder's commands, once each; never a live writer's
    story = journal.story()
    assert story.open == {} and story.lost() == []
    commands = story.commands_since("none", created_at=0.0) or []
    assert len(commands) == 303 and sum(c.lost for c in commands) == 3
    assert len({c.id for c in commands}) == 303


def test_the_recorder_writes_a_command_ahead_and_completes_it(sandbox: Sandbox, tmp_path: Path) -> None:
    recorded = HostState(tmp_path, durable=False).recorded(sandbox)
    taken = recorded.checkpoint("before")
    proc = recorded.start("read line; echo got $line", stdin=b"x\n", cwd="/tmp")
    # started, its end not yet seen: the journal already has it, and previews show it running
    [begun] = recorded.journal.records_of(ExecStartRecord)
    assert (begun.command, begun.cwd, begun.owner) == ("read line; echo got $line", "/tmp", liveness.current())
    preview = recorded.restore_preview(taken.id, diff=False)
    assert [(c.command, c.unfinished, c.lost) for c in preview.commands or ()] == [
        ("read line; echo got $line", True, False)]
    assert proc.wait(60) == 0
    [ended] = recorded.journal.records_of(ExecRecord)
    assert ended.id == begun.id and ended.exit_code == 0 and not ended.unfinished
    result = recorded.exec(["sh", "-c", "exit 3"])
    assert result.result.exit_code == 3
    starts, ends = recorded.journal.records_of(ExecStartRecord), recorded.journal.records_of(ExecRecord)
    assert [s.id for s in starts] == [e.id for e in ends] and len(ends) == 2


def test_settle_records_the_commands_a_dead_recorder_left_and_a_restore_counts_them(
        sandbox: Sandbox, tmp_path: Path) -> None:
    recorded = HostState(tmp_path, durable=False).recorded(sandbox)
    taken = recorded.checkpoint("before")
    recorded.journal.append(ExecStartRecord(sandbox=sandbox.name, id="gone", command="make deploy",
                                            owner=dead_process()))
    [lost] = recorded.settle()
    assert isinstance(lost, ExecRecord)
    assert lost.lost and lost.id == "gone" and lost.exit_code is None and "died before it ended" in (lost.error or "")
    assert recorded.settle() == []  # once
    [discarded] = recorded.restore(taken.id) or []
    assert discarded.command == "make deploy" and discarded.lost
    assert recorded.journal.records_of(RestoreRecord)[0].discarded == 1


# -- restores and checkpoints written ahead ----------------------------------------------------------


def left_by_a_dead_process(recorded: RecordedSandbox, intent: RestoreStartRecord | CheckpointStartRecord) -> None:
    """What a recorder killed with -9 midway leaves: the intent's marker and its record, no end."""
    markers = Markers(recorded.journal.path)
    markers.directory.mkdir(parents=True, exist_ok=True)
    assert intent.owner is not None
    (markers.directory / intent.intent).write_text(json.dumps(intent.owner.to_dict()))
    recorded.journal.append(intent)


def test_restores_and_checkpoints_are_written_ahead_and_leave_no_marker(sandbox: Sandbox, tmp_path: Path) -> None:
    recorded = HostState(tmp_path, durable=False).recorded(sandbox)
    taken = recorded.checkpoint("one")
    recorded.restore(taken.id)
    types = [(r.TYPE, getattr(r, "intent", None)) for r in recorded.journal.records()]
    assert [t for t, _ in types] == ["checkpoint_start", "checkpoint", "restore_start", "restore"]
    assert types[0][1] == types[1][1] and types[2][1] == types[3][1] and types[0][1] != types[2][1]
    assert not Markers(recorded.journal.path).any() and recorded.settle() == []


def test_a_dead_processs_restore_is_recorded_exactly_when_it_was_applied(sandbox: Sandbox, tmp_path: Path) -> None:
    recorded = HostState(tmp_path, durable=False).recorded(sandbox)
    sandbox.write_file("/root/state", b"A")
    taken = recorded.checkpoint("A")
    for applied in (True, False):
        sandbox.write_file("/root/state", b"B")
        left_by_a_dead_process(recorded, RestoreStartRecord(sandbox=sandbox.name, id=taken.id, intent=f"i{applied}",
                                                            discarded=0, owner=dead_process()))
        if applied:
            sandbox.restore(taken.id)  # it got as far as the backend's restore, then died
        assert recorded.exec("cat /root/state").result.stdout == ("A" if applied else "B")  # settled first
        story = recorded.journal.story()
        assert story.intents == {} and not Markers(recorded.journal.path).any()
        if applied:
            [restored] = recorded.journal.records_of(RestoreRecord)
            assert restored.intent == "iTrue" and "recorded by a later call" in (restored.note or "")
        else:
            [abandoned] = recorded.journal.records_of(AbandonedRecord)
            assert abandoned.intent == "iFalse" and "not applied" in abandoned.reason
    assert len(recorded.journal.records_of(RestoreRecord)) == 1


def test_a_dead_processs_checkpoint_is_adopted_with_its_story_or_abandoned(sandbox: Sandbox, tmp_path: Path) -> None:
    recorded = HostState(tmp_path, durable=False).recorded(sandbox)
    recorded.exec("echo one > /root/f")
    comment = "mine, caf\udce9"  # with a byte that is not UTF-8 (as argv gives it)
    left_by_a_dead_process(recorded, CheckpointStartRecord(sandbox=sandbox.name, intent="taken", comment=comment,
                                                           owner=dead_process()))
    raw = sandbox.checkpoint(comment)  # taken, then its process died before the record
    left_by_a_dead_process(recorded, CheckpointStartRecord(sandbox=sandbox.name, intent="never", comment="other",
                                                           owner=dead_process()))
    assert [c.journaled for c in recorded.checkpoints()] == [False]  # before settling: no story
    [adopted, abandoned] = recorded.settle()
    assert isinstance(adopted, CheckpointRecord) and (adopted.id, adopted.trigger, adopted.intent) == (
        raw.id, "manual", "taken")
    assert isinstance(abandoned, AbandonedRecord) and abandoned.intent == "never"
    [listed] = recorded.checkpoints()
    assert listed.journaled and [c.command for c in listed.commands] == ["echo one > /root/f"]
    assert recorded.settle() == [] and not Markers(recorded.journal.path).any()


# -- markers, and a lost command stopped whichever process recorded it ---------------------------------


def test_a_marker_names_its_process_so_a_listing_finds_the_dead_ones(tmp_path: Path) -> None:
    markers = Markers(tmp_path / "j.jsonl")
    markers.add("mine")
    child = ("import sys; from pathlib import Path; from hermes_sandboxes.recorder.writeahead import Markers; "
             "Markers(Path(sys.argv[1])).add('theirs')")
    subprocess.run([sys.executable, "-c", child, str(tmp_path / "j.jsonl")], check=True)  # it exits: dead
    assert markers.dead() == ["theirs"] and markers.any()
    markers.remove("theirs")  # another process's marker, found by its intent
    markers.remove("mine")
    assert not markers.any() and markers.dead() == []


API_RECORDER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from hermes_sandboxes.backends.local import LocalBackend
    from hermes_sandboxes.recorder.state import HostState
    sandbox = LocalBackend(Path(sys.argv[1])).get(sys.argv[2])
    recorded = HostState(Path(sys.argv[3]), durable=False).recorded(sandbox)
    recorded.exec("exec sleep 631", on_stdout=print)
""")


def test_a_python_api_recorder_killed_mid_command_has_it_stopped_by_the_next_recorded_call(
        local_backend: LocalBackend, sandbox: Sandbox, tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", API_RECORDER, str(local_backend.home), sandbox.name,
                              str(tmp_path)])
    running = "pgrep -ax sleep | awk '{print $3}'"
    deadline = time.monotonic() + 60
    while sandbox.exec(running).stdout != "631\n":
        assert child.poll() is None and time.monotonic() < deadline, "the child's command never ran"
        time.sleep(0.01)
    child.kill()
    child.wait()
    recorded = HostState(tmp_path, durable=False).recorded(sandbox)
    assert sandbox.exec(running).stdout == "631\n"  # runs on after its recorder died
    assert recorded.exec("true").result.exit_code == 0  # the next recorded command settles it first
    assert sandbox.exec(running).stdout == ""
    [lost] = [r for r in recorded.journal.records_of(ExecRecord) if r.command == "exec sleep 631"]
    assert lost.lost and lost.killed and lost.exit_code is None, lost
    assert not Markers(recorded.journal.path).any()
