"""``shell`` on a real terminal: the pty lives in the sandbox (``tty`` names it), job control works and
the window size follows the host terminal's. Driven through the CLI as a subprocess on a pty of ours.
The other shell tests (scripts from stdin, background jobs outliving the shell) are in test_cli.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from hermes_sandboxes.backends.local import LocalSandbox
from tests.cli import cli_kit
from tests.cli.cli_kit import CLI, Pty, as_json, ok
from tests.patience import read_until

home, box = cli_kit.home, cli_kit.box  # the shared fixtures, under the names the tests ask for


def test_tty_inside_the_shell_names_a_terminal_the_sandbox_sees(home: Path, box: LocalSandbox) -> None:
    term = Pty([*CLI, "--home", str(home), "shell", box.name])
    # typed words differ from the expected ones, which would otherwise match the terminal's echo
    term.send(b'echo "name=$(tty)="; [ -c "$(tty)" ] && echo device-$((2+2)); ps -o tty= -p $$\r')
    term.expect(b"name=/dev/pts/")
    term.expect(b"device-4")
    term.expect(b"pts/")  # ps finds the shell's terminal too
    assert b"not a tty" not in term.seen
    term.send(b"exit\r")
    assert term.finish() == 0
    assert [r["command"] for r in as_json(home, "log", box.name)] == ["(interactive shell)"]


def test_ctrl_z_stops_the_foreground_job_and_the_shell_takes_the_terminal_back(home: Path,
                                                                                box: LocalSandbox) -> None:
    term = Pty([*CLI, "--home", str(home), "shell", box.name])
    term.send(b"sh -c 'echo go-$((5*5)); exec sleep 600'\r")
    term.expect(b"go-25")  # the job runs in the foreground (a key sent earlier would flush the typed line)
    term.send(b"\x1a")  # Ctrl-Z, as a key: the pty inside turns it into SIGTSTP for the job
    term.expect(b"Stopped")
    term.send(b"jobs -s | wc -l | sed s/^/stopped-/\r")
    term.expect(b"stopped-1")
    term.send(b"exit\r")  # bash keeps a terminal with stopped jobs open once, as on a real one
    term.expect(b"There are stopped jobs")
    term.send(b"exit\r")  # the second time it leaves, and the kernel hangs the stopped job up
    term.finish()


# A program in the foreground that reports its terminal's size at start and after each SIGWINCH. It
# blocks SIGWINCH before it first reports, so a resize made once that report is seen is never lost:
# it waits pending for sigwait. (A bash WINCH trap is no witness: bash runs the trap at once only when
# the signal finds it inside readline; one that lands while bash prepares its prompt waits for the next
# line typed, and the test would hang on a resize that reached the shell.)
WINDOW_REPORTER = (b"python3 -c 'import os, signal as s; s.pthread_sigmask(s.SIG_BLOCK, [s.SIGWINCH])\n"
                   b"for n in range(3):\n"
                   b" c, r = os.get_terminal_size(1); print(\"size-%d-%dx%d\" % (n, r, c), flush=True)\n"
                   b" n < 2 and s.sigwait([s.SIGWINCH])'\r")


def test_the_window_size_is_passed_at_start_and_on_every_resize(home: Path, box: LocalSandbox) -> None:
    term = Pty([*CLI, "--home", str(home), "shell", box.name], rows_cols=(31, 97))
    term.send(WINDOW_REPORTER)
    term.expect(b"size-0-31x97")
    term.resize(40, 120)  # the kernel sends the CLI SIGWINCH; it resizes the pty inside, which signals the job
    term.expect(b"size-1-40x120")
    term.resize(50, 132)
    term.expect(b"size-2-50x132")
    term.send(b"exit\r")
    assert term.finish() == 0


def test_a_shell_is_written_ahead_and_one_whose_cli_was_killed_is_stopped_by_the_next_call(
        home: Path, box: LocalSandbox) -> None:
    term = Pty([*CLI, "--home", str(home), "shell", box.name])
    # a job that survives the terminal's hang-up (nohup), as after closing a real terminal
    term.send(b"nohup sleep 607 >/dev/null 2>&1 & echo bg-$((3*3))\r")
    term.expect(b"bg-9")
    [running] = as_json(home, "log", box.name)  # in the record while it runs
    assert running["command"] == "(interactive shell)" and running["unfinished"] and not running.get("lost"), running
    assert "sleep 607" in box.exec("pgrep -ax sleep || true").stdout
    term.proc.kill()  # kill -9: no clean-up of ours runs
    term.finish()
    [lost] = as_json(home, "log", box.name)
    assert lost["lost"] and lost["exit_code"] is None, lost
    assert "sleep 607" in box.exec("pgrep -ax sleep || true").stdout  # the shell's job runs on until settled
    assert ok(home, "exec", box.name, "--", "echo next").stdout == "next\n"
    assert box.exec("pgrep -ax sleep || echo none").stdout == "none\n"  # the next call stopped it
    shell, _ = as_json(home, "log", box.name)
    assert shell["lost"] and shell["killed"] and not shell.get("unfinished"), shell
    assert "a later call stopped it in the sandbox" in shell["error"], shell


def test_a_terminal_that_hangs_up_ends_the_shell_as_a_closed_window_does(home: Path, box: LocalSandbox,
                                                                         tmp_path: Path) -> None:
    """The CLI's own terminal goes away (a closed window, a dropped ssh): the CLI gets SIGHUP from the
    kernel, and hangs up the shell's pty in turn. bash passes SIGHUP on to its jobs; what was left
    with nohup, setsid or disown lives on; no traceback from restoring a terminal that is gone."""
    master, slave = os.openpty()
    with open(tmp_path / "stderr", "wb") as stderr:  # not the terminal: we read it after the hang-up
        proc = subprocess.Popen(["setsid", "--ctty", *CLI, "--home", str(home), "shell", box.name],
                                stdin=slave, stdout=slave, stderr=stderr)
    os.close(slave)
    # (and a job that keeps writing to the terminal, so output is under way when it hangs up)
    os.write(master, b"sleep 604 & nohup sleep 601 >/dev/null 2>&1 & setsid sleep 602 & sleep 603 & disown; "
                     b"while :; do echo tick; sleep 0.01; done & echo job-$((2*3))\r")
    deadline = time.monotonic() + 60
    read_until(master, b"job-6\r\n")  # the typed line is echoed as "job-$((2*3))"
    # each job is sleep itself by now (so nohup has ignored SIGHUP and setsid has left the session:
    # a terminal closed before that would hang them up too, here as on a real one)
    while sorted(box.exec("pgrep -ax sleep | cut -d' ' -f3 | grep ^60").stdout.split()) != ["601", "602", "603", "604"]:
        assert time.monotonic() < deadline, "the jobs never started"
        time.sleep(0.02)
    os.close(master)  # the terminal hangs up
    assert proc.wait(timeout=60) == 129
    assert (tmp_path / "stderr").read_bytes().strip() == b"error: interrupted by SIGHUP"
    deadline = time.monotonic() + 60
    while (left := ok(home, "exec", box.name, "--", "pgrep -ax sleep | cut -d' ' -f3 | sort").stdout.split()) \
            != ["601", "602", "603"]:  # the plain jobs are hung up; may take a moment to go
        assert time.monotonic() < deadline and set(left) >= {"601", "602", "603"}, left
        time.sleep(0.05)
    shell = [r for r in as_json(home, "log", box.name) if r["command"] == "(interactive shell)"]
    assert [(r["exit_code"], r.get("lost")) for r in shell] == [(129, None)], shell  # bash's own end, recorded


def test_a_shell_whose_cli_gets_sigterm_is_stopped_and_its_end_recorded_at_once(home: Path,
                                                                                box: LocalSandbox) -> None:
    term = Pty([*CLI, "--home", str(home), "shell", box.name])
    term.send(b"nohup sleep 608 >/dev/null 2>&1 & echo bg-$((4*4))\r")
    term.expect(b"bg-16")
    term.proc.send_signal(signal.SIGTERM)
    assert term.finish() == 143
    assert box.exec("pgrep -ax sleep || echo none").stdout == "none\n"  # what it started is stopped
    [shell] = as_json(home, "log", box.name)  # and its end is recorded by the CLI itself, not left lost
    assert shell["killed"] and shell["error"] == "interrupted by SIGTERM", shell
    assert not shell.get("lost") and not shell.get("unfinished"), shell
