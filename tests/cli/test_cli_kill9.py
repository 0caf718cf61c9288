"""The record and the filesystem agree, whatever ends the CLI: SIGTERM at several moments, and
SIGKILL (which no clean-up can intercept) at many points of ``exec``, ``checkpoint create`` and
``checkpoint restore``. After each, a command that started is in the journal (ended, or lost with
the CLI), a restore is applied and recorded or not applied at all, and the next CLI call works.

The points are reached by polling for what the process has done (its journal line, its output,
its preview) or by a sweep of delays scaled to how long the same call takes here, never by
absolute timings in assertions.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hermes_sandboxes.backends.local import LocalSandbox
from hermes_sandboxes.names import unique_name
from hermes_sandboxes.recorder.state import HostState
from tests.cli import cli_kit, warm_kit
from tests.cli.cli_kit import CLI, Pty, as_json, hs, ok

home, box = cli_kit.home, cli_kit.box


@pytest.fixture(autouse=True)
def in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLIs killed here run in-process (what a kill -9 leaves of a warm call, whose worker
    lives on and stops the command itself, is in test_cli_warm.py; the exec sweep runs both)."""
    monkeypatch.setenv(warm_kit.SWITCH, "0")


def cli(home: Path, *args: str) -> list[str]:
    return [*CLI, "--home", str(home), *args]


def execs(home: Path, name: str) -> list[dict[str, Any]]:
    return [r for r in as_json(home, "log", name) if r["type"] == "exec"]


def journal_text(box: LocalSandbox) -> bytes:
    try:
        return HostState().journal_path(box.backend.key, box.name).read_bytes()
    except FileNotFoundError:
        return b""


def _written_ahead(box: LocalSandbox, mark: str) -> bool:
    return mark.encode() in journal_text(box)


def poll(predicate: Callable[[], bool], proc: subprocess.Popen[bytes], what: str, timeout: float = 60) -> None:
    """Wait until ``predicate`` holds (or the process ended by itself: then the point was passed)."""
    deadline = time.monotonic() + timeout
    while not predicate() and proc.poll() is None:
        assert time.monotonic() < deadline, f"never saw {what}"
        time.sleep(0.002)


def took(argv: list[str], env: dict[str, str] | None = None) -> float:
    """How long one uninterrupted run of ``argv`` takes on this machine now (to scale a sweep)."""
    started = time.monotonic()
    subprocess.run(argv, capture_output=True, timeout=120, check=True, env=env)
    return time.monotonic() - started


# -- exec ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("warm", [False, True], ids=["in-process", "warm"])
def test_an_exec_killed_with_sigkill_at_any_point_is_in_the_record_if_it_ran(
        home: Path, box: LocalSandbox, warm: bool) -> None:
    """In-process, a command whose CLI was killed is recorded as lost (gc settles it); served warm,
    its worker sees the client go and stops and records it (interrupted), so nothing is lost."""
    env = {k: v for k, v in os.environ.items() if k != warm_kit.SWITCH} if warm else {**os.environ}
    if warm:
        warm_kit.start(env)
    full = took(cli(home, "exec", box.name, "--", "true"), env)
    points: list[tuple[str, float]] = [("running", 0.0), ("written ahead", 0.0)]
    points += [("after", full * k / 10) for k in range(12)]  # from start-up to past the end
    ended_early: dict[int, tuple[int, bytes]] = {}  # CLIs that ended before their kill: why, if it fails
    for i, (point, delay) in enumerate(points):
        mark = f"/root/ran-{i}"
        command = f"touch {mark}; echo started" + ("; exec sleep 600" if i % 2 == 0 else "")
        with tempfile.TemporaryFile() as errors:
            proc = subprocess.Popen(cli(home, "exec", box.name, "--", command), stdout=subprocess.PIPE,
                                    stderr=errors, env=env)
            assert proc.stdout is not None
            if point == "written ahead":
                poll(functools.partial(_written_ahead, box, mark), proc, "the command written ahead")
            elif point == "running":
                assert proc.stdout.readline() == b"started\n"
            else:
                time.sleep(delay)
            if proc.poll() is not None:
                errors.seek(0)
                ended_early[i] = (proc.returncode, errors.read())
            proc.kill()
            proc.wait()
            proc.stdout.close()
        assert ok(home, "exec", box.name, "--", "echo next").stdout == "next\n"  # the next call works
    if warm:  # the workers of killed clients record their commands' ends as they stop them
        deadline = time.monotonic() + 60
        while any(r.get("unfinished") for r in execs(home, box.name)):
            assert time.monotonic() < deadline, execs(home, box.name)
            time.sleep(0.05)
    ran = set(box.exec("ls /root").stdout.split())
    recorded = {r["command"].split(";")[0].removeprefix("touch /root/"): r for r in execs(home, box.name)
                if r["command"].startswith("touch")}
    assert ran - {f"ran-{i}" for i in range(len(points))} == set(), ran
    assert ran - set(recorded) == set(), (ran, recorded, ended_early)  # what ran is in the record
    # the polled points were reached before the kill
    assert "ran-0" in ran and "ran-1" in recorded, (sorted(ran), sorted(recorded), ended_early)
    for name, record in recorded.items():  # each one's end, or honestly none
        if warm and record.get("killed"):  # (stopped before or after it touched its mark)
            assert record["error"] == "interrupted by SIGHUP", record
        elif record["exit_code"] is None:
            assert record.get("lost") and record["error"].startswith("lost: the process recording it"), record
        else:
            assert record["exit_code"] == 0 and name in ran, record
    if warm:
        assert not any(r.get("lost") for r in recorded.values()), recorded
        assert "recorded lost commands" not in ok(home, "gc").stderr
        return
    # the next call on the sandbox (each `exec echo next` above), gc, or the next checkpoint or restore
    # writes the lost ones' ends once, for good
    ok(home, "gc")
    settled = [r for r in execs(home, box.name) if r["command"].startswith("touch")]
    assert sorted(r["command"] for r in settled) == sorted(r["command"] for r in recorded.values())
    assert not any(r.get("unfinished") for r in settled), settled
    assert "recorded lost commands" not in ok(home, "gc").stderr  # nothing left to settle


def test_log_shows_a_command_still_running_as_running(home: Path, box: LocalSandbox) -> None:
    proc = subprocess.Popen(cli(home, "exec", box.name, "--", "echo started; read line"), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdin is not None
    try:
        assert proc.stdout.readline() == b"started\n"
        [running] = execs(home, box.name)
        assert running["unfinished"] and not running.get("lost") and running["exit_code"] is None, running
        assert "running" in ok(home, "log", box.name).stdout
        assert "recorded lost commands" not in ok(home, "gc").stderr  # its CLI lives: not settled
    finally:
        proc.communicate(b"go\n", timeout=60)
    [ended] = execs(home, box.name)
    assert ended["exit_code"] == 0 and not ended.get("unfinished"), ended
# -- the record and the filesystem agree ---------------------------------------------------------------


def _uninterrupted(home: Path, what: str) -> float:
    """How long an uninterrupted ``checkpoint create`` or ``checkpoint restore`` takes on this machine
    now, measured on a sandbox of its own (so the one under test keeps a record of the sweep alone):
    the sweeps' delays are fractions of it, so they fall inside the call however loaded the machine."""
    name = unique_name("kill9-measure")
    ok(home, "create", name)
    try:
        if what == "create":
            return took(cli(home, "checkpoint", "create", name))
        taken = ok(home, "checkpoint", "create", name).stdout.strip()
        return took(cli(home, "checkpoint", "restore", name, taken, "--yes"))
    finally:
        ok(home, "rm", name, "--yes")


def _restore_interrupted(home: Path, box: LocalSandbox, sig: signal.Signals, point: float | str) -> tuple[int, bytes]:
    """Restore ``box`` to a checkpoint of state A from state B and send ``sig`` at ``point``: a delay
    (that fraction of an uninterrupted restore's time here) after the preview is shown (on a
    terminal, so we see it as it is printed: the restore is about to start), "written ahead" (its
    record is in the journal) or "restore-staged" (the store has staged the copy and pauses before
    swapping it in: HERMES_SANDBOXES_TEST_PAUSE)."""
    delay = point * _uninterrupted(home, "restore") if isinstance(point, float) else 0.0
    box.write_file("/root/state", b"A")
    taken = ok(home, "checkpoint", "create", box.name).stdout.strip()
    box.write_file("/root/state", b"B")
    box.write_file("/root/b-only", b"B")
    pause = Path(tempfile.mkdtemp(prefix="hsb-pause-")) / "paused"
    env = {"HERMES_SANDBOXES_TEST_PAUSE": "restore-staged", "HERMES_SANDBOXES_TEST_PAUSE_MARKER": str(pause)}
    term = Pty(cli(home, "checkpoint", "restore", box.name, taken, "--yes"),
               env=env if point == "restore-staged" else None)
    term.expect(b"commands since the checkpoint")
    if point == "written ahead":
        poll(lambda: b'"restore_start"' in journal_text(box), term.proc, "the restore written ahead")
    elif point == "restore-staged":
        poll(lambda: pause.exists() and bool(pause.read_text()), term.proc, "the restore paused once staged")
    else:
        time.sleep(delay)
    term.proc.send_signal(sig)
    pause.unlink(missing_ok=True)
    pause.parent.rmdir()
    return term.finish(), term.seen


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("delay", [0.0, 0.05, 0.15, 0.3, 0.5, 1.0])  # fractions of a restore's time here
def test_an_interrupted_restore_is_not_applied_or_applied_recorded_and_reported(
        home: Path, box: LocalSandbox, delay: float, sig: signal.Signals) -> None:
    code, seen = _restore_interrupted(home, box, sig, delay)
    state = box.read_file("/root/state")
    b_only = hs(home, "exec", box.name, "--", "test -e /root/b-only").exit_code
    restores = [r for r in as_json(home, "log", box.name) if r["type"] == "restore"]
    assert b"Traceback" not in seen, seen
    if state == b"A":  # applied: all of it, in the journal, and said
        assert b_only == 1 and len(restores) == 1 and b"restored" in seen, (code, seen)
    else:  # not applied: none of it, and not recorded
        assert state == b"B" and b_only == 0 and restores == [] and b"restored" not in seen, (code, seen)
    assert code in (0, 128 + sig, -sig), (code, seen)  # -N: it came after our handlers were put back


@pytest.mark.parametrize("point", ["written ahead", "restore-staged", 0.0, 0.1, 0.25, 0.5, 1.0, 2.0])
def test_a_restore_killed_with_sigkill_is_all_or_nothing_and_recorded_so(
        home: Path, box: LocalSandbox, point: float | str) -> None:
    _restore_interrupted(home, box, signal.SIGKILL, point)
    look = ("exec", box.name, "--", "cat /root/state; test -e /root/b-only && echo +b; true")
    # (known: the first command after a restore killed mid-way may find the init it restarted gone, 125)
    first = hs(home, *look)
    listing = (first if first.exit_code == 0 else ok(home, *look)).stdout
    assert listing in ("A", "B+b\n"), listing  # the checkpoint's files, or all of the newer ones
    # the next call settled it first: recorded as restored exactly when the files are the checkpoint's
    logged = as_json(home, "log", box.name)
    restores = [r for r in logged if r["type"] == "restore"]
    assert len(restores) == (1 if listing == "A" else 0), (listing, logged)
    assert not any(r["type"] == "restore_start" for r in logged), logged  # none left without an end
    if point in ("written ahead", "restore-staged"):
        assert listing == "B+b\n" and any(r["type"] == "abandoned" for r in logged), logged


@pytest.mark.parametrize("point", ["written ahead", "checkpoint-staged", 0.0, 0.1, 0.25, 0.5, 1.0])  # fractions
def test_a_checkpoint_killed_with_sigkill_is_listed_with_its_story_or_not_at_all(
        home: Path, box: LocalSandbox, point: float | str) -> None:
    delay = point * _uninterrupted(home, "create") if isinstance(point, float) else 0.0
    ok(home, "exec", box.name, "--", "echo before > /root/state")
    pause = Path(tempfile.mkdtemp(prefix="hsb-pause-")) / "paused"
    env = {**os.environ, "HERMES_SANDBOXES_TEST_PAUSE": "checkpoint-staged",
           "HERMES_SANDBOXES_TEST_PAUSE_MARKER": str(pause)}
    proc = subprocess.Popen(cli(home, "checkpoint", "create", box.name, "-m", "killed"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env if point == "checkpoint-staged" else None)
    if point == "written ahead":
        poll(lambda: b'"checkpoint_start"' in journal_text(box), proc, "the checkpoint written ahead")
    elif point == "checkpoint-staged":
        poll(lambda: pause.exists() and bool(pause.read_text()), proc, "the checkpoint paused once staged")
    else:
        time.sleep(delay)
    proc.kill()
    proc.wait()
    pause.unlink(missing_ok=True)
    pause.parent.rmdir()
    assert ok(home, "exec", box.name, "--", "cat /root/state").stdout == "before\n"  # the next call works
    listed = as_json(home, "checkpoint", "list", box.name)
    assert all(c["journaled"] and c["trigger"] == "manual" for c in listed), listed  # each with its story
    logged = as_json(home, "log", box.name)
    recorded = [r["id"] for r in logged if r["type"] == "checkpoint"]
    assert sorted(recorded) == sorted(c["id"] for c in listed), (recorded, listed)  # the record names what exists
    assert not any(r["type"] == "checkpoint_start" for r in logged), logged  # none left without an end
    if point == "checkpoint-staged":
        assert listed == [] and any(r["type"] == "abandoned" for r in logged), logged


# -- a lost command is stopped inside -------------------------------------------------------------------


def _sleeps(box: LocalSandbox) -> set[str]:
    """The durations of the ``sleep`` processes running in ``box`` (asked through the bare API, which
    records and settles nothing)."""
    return set(box.exec("pgrep -ax sleep | awk '{print $3}'").stdout.split())


def _killed_running(home: Path, box: LocalSandbox, seconds: int) -> None:
    """A CLI running ``exec`` of ``sleep SECONDS`` in ``box``, killed with SIGKILL once it runs."""
    proc = subprocess.Popen(cli(home, "exec", box.name, "--", f"echo started; exec sleep {seconds}"),
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"started\n"
    poll(lambda: str(seconds) in _sleeps(box), proc, f"sleep {seconds} running")  # past the shell's exec
    proc.kill()
    proc.wait()
    proc.stdout.close()


def _ends(home: Path, box: LocalSandbox, seconds: int) -> list[dict[str, Any]]:
    return [r for r in execs(home, box.name) if r["command"].endswith(f"exec sleep {seconds}")]


@pytest.mark.parametrize("settler", [("exec", "NAME", "--", "echo next"), ("gc",), ("checkpoint", "create", "NAME"),
                                     ("shell", "NAME")])
def test_the_next_call_stops_the_command_of_a_killed_cli_inside_and_records_it_so(
        home: Path, box: LocalSandbox, settler: tuple[str, ...]) -> None:
    _killed_running(home, box, 601)
    assert _sleeps(box) == {"601"}  # the command runs on inside, its CLI dead
    [shown] = _ends(home, box, 601)
    assert shown["lost"] and shown.get("unfinished"), shown  # a reader shows it lost, and settles nothing
    assert _sleeps(box) == {"601"}
    ok(home, *(box.name if arg == "NAME" else arg for arg in settler), input="exit\n")
    assert _sleeps(box) == set()  # stopped inside
    [ended] = _ends(home, box, 601)
    assert ended["lost"] and ended["killed"] and not ended.get("unfinished"), ended
    assert ended["exit_code"] is None and "a later call stopped it in the sandbox" in ended["error"], ended
    ok(home, "gc")
    assert len(_ends(home, box, 601)) == 1  # settled once


def test_a_lost_command_that_ended_by_itself_is_recorded_as_over_not_stopped(home: Path, box: LocalSandbox) -> None:
    _killed_running(home, box, 602)
    # it ends inside, nobody recording it: and is over, not only signalled (pkill returns once the
    # signal is sent; a process the next call finds still exiting, or not yet reaped by the sandbox's
    # init, is one that call stops itself, and rightly says so): wait until the init has reaped it
    assert box.exec("set -- $(pgrep -x sleep); [ $# = 1 ] && kill $1 && while kill -0 $1 2>/dev/null; "
                    "do sleep 0.01; done && echo over", timeout=60).stdout == "over\n"
    assert _sleeps(box) == set()
    ok(home, "exec", box.name, "--", "true")
    [ended] = _ends(home, box, 602)
    assert ended["lost"] and not ended.get("killed") and "had ended in the sandbox" in ended["error"], ended


def test_settling_never_touches_a_command_of_a_live_recorder_even_when_settlers_race(
        home: Path, box: LocalSandbox) -> None:
    """Live CLIs and killed ones, interleaved, then several calls settle at once: each killed CLI's
    command is stopped and ended once, each live one's runs on and ends as its CLI records it."""
    live = []
    for i in range(3):
        _killed_running(home, box, 610 + i)
        proc = subprocess.Popen(cli(home, "exec", box.name, "--", f"echo started; read line; echo got {i}"),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"started\n"
        live.append(proc)
    settlers = [subprocess.Popen(cli(home, *args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                for args in (["gc"], ["exec", box.name, "--", "true"], ["gc"], ["exec", box.name, "--", "true"])]
    try:
        for settler in settlers:
            _, err = settler.communicate(timeout=120)
            assert settler.returncode == 0, err
        assert _sleeps(box) == set()  # the killed CLIs' commands are stopped
        assert box.exec("pgrep -fc 'read line'").stdout == "3\n"  # and the live ones run on
        for i in range(3):
            [ended] = _ends(home, box, 610 + i)
            assert ended["lost"] and ended["killed"], ended
    finally:
        outputs = [proc.communicate(b"go\n", timeout=60)[0] for proc in live]
    assert outputs == [f"started\ngot {i}\n".encode()[len(b"started\n"):] for i in range(3)], outputs
    assert [proc.returncode for proc in live] == [0, 0, 0]
    for i in range(3):
        [ended] = [r for r in execs(home, box.name) if r["command"].endswith(f"echo got {i}")]
        assert ended["exit_code"] == 0 and not ended.get("lost") and not ended.get("killed"), ended


def test_a_warm_worker_killed_mid_command_has_it_stopped_by_the_next_call(home: Path, box: LocalSandbox) -> None:
    """On the warm path the worker records the command: when the worker itself is killed with -9,
    the command is lost with it, and the next call stops it inside as for a killed CLI."""
    env = {k: v for k, v in os.environ.items() if k != warm_kit.SWITCH}  # (this module's CLIs run in-process)
    warm_kit.start(env)
    took(cli(home, "exec", box.name, "--", "true"), env)  # (the first call after a start may run in-process)
    proc = subprocess.Popen(cli(home, "exec", box.name, "--", "echo started; exec sleep 641"), env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"started\n"
    poll(lambda: "641" in _sleeps(box), proc, "sleep 641 running")
    worker = warm_kit.owners(HostState().journal_path(box.backend.key, box.name))[-1]
    assert worker != proc.pid  # served warm: the worker records it
    os.kill(worker, signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 125, err
    assert _sleeps(box) == {"641"}  # runs on, its recorder dead
    assert ok(home, "exec", box.name, "--", "true").exit_code == 0
    assert _sleeps(box) == set()
    [ended] = _ends(home, box, 641)
    assert ended["lost"] and ended["killed"] and f"pid {worker}" in ended["error"], ended
