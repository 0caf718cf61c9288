"""The README says what the command line prints, and these tests hold it to that.

- Every ``console`` block that the line ``<!-- checked: console -->`` precedes is run, command by
  command (the lines that start with ``$ ``), through the installed ``hermes-sandboxes`` script in a
  shell, against a real local store made for the block, as a script runs it: stdin not a terminal,
  stdout and stderr into one pipe, as the README shows them. The output must be what the block
  shows once ids, times, dates and sizes are normalised (see ``normalise``). ``$ echo $?`` prints
  the exit code of the command before it, as a shell would. A block that continues an earlier
  story says how to get there unseen: ``<!-- checked: console; first: SHELL LINE -->``.
- Every row of the README's exit-code table has a scenario below that makes the real CLI (a
  subprocess, so the fast exec path is the one tried) end with that code, and no scenario is left
  without its row.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hermes_sandboxes.backends.local import LocalBackend
from tests.conftest import make_backend, teardown_backend
from tests.interrupts import interruptible

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MARKER = re.compile(r"<!-- checked: console(?:; first: (?P<first>.+))? -->")
SCRIPT = Path(sys.executable).parent / "hermes-sandboxes"


# -- reading the README ---------------------------------------------------------------------------


def checked_blocks(text: str) -> list[tuple[int, str, list[tuple[str, list[str]]]]]:
    """Each checked console block: its line number, the shell line that sets up what it assumes
    (``; first: ...`` in its marker, run unseen) and its (command, expected output lines)."""
    lines = text.splitlines()
    blocks = []
    for i, line in enumerate(lines):
        marker = MARKER.fullmatch(line.strip())
        if marker is None:
            continue
        assert lines[i + 1].strip() == "```console", f"README.md:{i + 1}: the marker must precede a console block"
        steps: list[tuple[str, list[str]]] = []
        for body in lines[i + 2:]:
            if body.startswith("```"):
                break
            if body.startswith("$ "):
                steps.append((body[2:], []))
            else:
                assert steps, f"README.md:{i + 3}: a checked block starts with a command"
                steps[-1][1].append(body)
        blocks.append((i + 1, marker.group("first") or "", steps))
    return blocks


def exit_code_table(text: str) -> dict[str, str]:
    """The rows of the README's exit-code table: code column -> meaning."""
    section = text.split("### Exit codes", 1)[1]
    rows: dict[str, str] = {}
    for line in section.splitlines()[1:]:
        if rows and not line.startswith("|"):
            break
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]  # "\|" is a "|" in a cell
        if len(cells) == 2 and cells[0] not in ("code", "---"):
            rows[cells[0]] = cells[1]
    return rows


_ID = re.compile(r"\bck-[0-9a-f]{8}\b")
_PATTERNS = [
    (re.compile(r"\b\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\b"), "<date>"),
    (re.compile(r"\b\d+(\.\d+)?(ms|s|m|h|d) ago\b"), "<age> ago"),
    (re.compile(r"\b\d+(\.\d+)? (ms|s)\b"), "<duration>"),
    (re.compile(r"[-+]?\b\d+(\.\d+)? (B|KiB|MiB|GiB|TiB)\b"), "<size>"),
    (re.compile(r"git version \S+"), "git version <version>"),
]


def normalise(lines: list[str]) -> list[str]:
    """``lines`` with what differs from run to run made the same: checkpoint ids numbered in order
    of appearance, dates, ages, durations and sizes replaced by a placeholder, runs of spaces
    (table padding, which follows the widest cell) made one."""
    ids: dict[str, str] = {}
    out = []
    for line in lines:
        line = _ID.sub(lambda m: ids.setdefault(m.group(), f"ck-<{len(ids) + 1}>"), line)
        for pattern, placeholder in _PATTERNS:
            line = pattern.sub(placeholder, line)
        out.append(" ".join(line.split()))
    return out


# -- a store for the examples ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, str], LocalBackend]]:
    """The environment of a first-time user: a new store, a new state directory, no config file."""
    backend = make_backend(Path(tempfile.mkdtemp(prefix="hsb-readme-", dir="/tmp")), image_size="4G")
    where = tmp_path_factory.mktemp("readme")
    env = {**os.environ, "HERMES_SANDBOXES_HOME": str(backend.home), "HERMES_SANDBOXES_STATE": str(where / "state"),
           "XDG_CONFIG_HOME": str(where / "config"), "PATH": f"{SCRIPT.parent}:{os.environ['PATH']}"}
    env.pop("HERMES_SANDBOXES_BACKEND", None)
    env.pop("HERMES_SANDBOXES_CONFIG", None)  # the default path, absent as on a new machine
    try:
        yield env, backend
    finally:
        teardown_backend(backend)


@pytest.fixture
def fresh(store: tuple[dict[str, str], LocalBackend]) -> Iterator[dict[str, str]]:
    """The store with no sandbox in it, before and after (each example starts its own story)."""
    env, backend = store
    for name in backend.names():
        backend.get(name).destroy()
    yield env
    for name in backend.names():
        backend.get(name).destroy()


@pytest.fixture
def work(store: tuple[dict[str, str], LocalBackend]) -> dict[str, str]:
    """The store with a sandbox named ``work`` (the exit-code scenarios leave it as it was)."""
    env, backend = store
    if "work" not in backend.names():
        assert cli(env, "create", "work").returncode == 0
    return env


def shell(env: dict[str, str], command: str) -> subprocess.CompletedProcess[str]:
    """``command`` run as the README's reader would, from the checkout, stdin not a terminal,
    stdout and stderr into one pipe."""
    return subprocess.run(["bash", "-c", command], env=env, cwd=ROOT, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120, check=False)


_BLOCKS = checked_blocks(README.read_text())


def test_the_readme_marks_its_cli_examples_as_checked() -> None:
    assert len(_BLOCKS) >= 2, "the README's console examples lost their checked marker"


@pytest.mark.parametrize("line, first, steps", _BLOCKS, ids=[f"README.md:{line}" for line, _, _ in _BLOCKS])
def test_a_checked_readme_example_prints_what_the_readme_shows(
        fresh: dict[str, str], line: int, first: str, steps: list[tuple[str, list[str]]]) -> None:
    env = fresh
    if first:
        done = shell(env, first)
        assert done.returncode == 0, done.stdout
    expected: list[str] = []
    seen: list[str] = []
    ids: dict[str, str] = {}  # the README's checkpoint ids -> this run's, as their outputs name them
    code = 0
    for command, output in steps:
        expected += [f"$ {command}", *output]
        if command == "echo $?":
            seen += [f"$ {command}", str(code)]
            continue
        ran = _ID.sub(lambda m: ids.get(m.group(), m.group()), command)
        done = shell(env, ran)
        code = done.returncode
        seen += [f"$ {ran}", *done.stdout.splitlines()]
        for readme_id, real_id in zip(_firsts(output), _firsts(done.stdout.splitlines()), strict=False):
            ids.setdefault(readme_id, real_id)
    assert normalise(seen) == normalise(expected), "\n".join(seen)


def _firsts(lines: list[str]) -> list[str]:
    """The checkpoint ids ``lines`` name, each once, in order of appearance."""
    return list(dict.fromkeys(_ID.findall("\n".join(lines))))


# -- the exit-code table ---------------------------------------------------------------------------


_STDERR: list[str] = []  # what each scenario's CLI said, to show when a code is not the table's


def cli(env: dict[str, str], *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(SCRIPT), *args], env=env, input=stdin if stdin is not None else "",
                          capture_output=True, text=True, timeout=120, check=False)
    _STDERR.append(f"{' '.join(args)} -> {done.returncode}: {done.stderr[-2000:]}")
    return done


def _until_then_signal(env: dict[str, str], sig: signal.Signals) -> int:
    proc = subprocess.Popen(interruptible([str(SCRIPT), "exec", "work", "--", "echo started; exec sleep 600"]), env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"started\n"
    proc.send_signal(sig)
    proc.communicate(timeout=60)
    return proc.returncode


def _reader_goes_away(env: dict[str, str]) -> int:
    proc = subprocess.Popen([str(SCRIPT), "exec", "work", "--", "yes"], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"y\n"
    proc.stdout.close()
    proc.communicate(timeout=60)
    return proc.returncode


def _timed_out(env: dict[str, str]) -> int:
    started = time.monotonic()
    code = cli(env, "exec", "work", "--timeout", "0.5", "--", "sleep 600").returncode
    assert time.monotonic() - started < 60  # a backstop, not a timing: the command was stopped
    return code


Scenario = Callable[[dict[str, str]], int]
# row of the table -> (what is tried, how) and the code(s) the row promises for each
_SCENARIOS: dict[str, list[tuple[str, Scenario, int]]] = {
    "0": [("exec true", lambda e: cli(e, "exec", "work", "--", "true").returncode, 0)],
    "1": [("an unknown checkpoint", lambda e: cli(e, "checkpoint", "show", "work", "ck-deadbeef").returncode, 1),
          ("a failed health command", lambda e: cli(e, "checkpoint", "create", "work", "--health", "false").returncode,
           1),
          ("a hung health command past --health-timeout",
           lambda e: cli(e, "checkpoint", "create", "work", "--health", "sleep 600", "--health-timeout", "0.5"
                         ).returncode, 1)],
    "2": [("an unknown option", lambda e: cli(e, "exec", "work", "--bogus", "--", "true").returncode, 2),
          ("a malformed --env", lambda e: cli(e, "exec", "work", "--env", "NOEQUALS", "--", "true").returncode, 2),
          ("a relative --cwd", lambda e: cli(e, "exec", "work", "--cwd", "tmp", "--", "true").returncode, 2),
          ("--timeout 0", lambda e: cli(e, "exec", "work", "--timeout", "0", "--", "true").returncode, 2),
          ("--memory without a unit", lambda e: cli(e, "create", "other", "--memory", "512").returncode, 2),
          ("rm without --yes, stdin not a terminal", lambda e: cli(e, "rm", "work", stdin="y\n").returncode, 2)],
    "N": [("exit 7 inside", lambda e: cli(e, "exec", "work", "--", "exit 7").returncode, 7),
          ("SIGTERM inside", lambda e: cli(e, "exec", "work", "--", "kill -TERM $$").returncode, 143)],
    "124": [("--timeout reached", _timed_out, 124)],
    "137": [("SIGKILL inside", lambda e: cli(e, "exec", "work", "--", "kill -KILL $$").returncode, 137)],
    "125": [("no such sandbox", lambda e: cli(e, "exec", "nosuch", "--", "true").returncode, 125)],
    "126": [("--cwd missing inside", lambda e: cli(e, "exec", "work", "--cwd", "/nonexistent", "--", "true"
                                                   ).returncode, 126)],
    "130, 143, 129": [("Ctrl-C", lambda e: _until_then_signal(e, signal.SIGINT), 130),
                      ("SIGTERM", lambda e: _until_then_signal(e, signal.SIGTERM), 143),
                      ("SIGHUP", lambda e: _until_then_signal(e, signal.SIGHUP), 129)],
    "141": [("the reader went away", _reader_goes_away, 141)],
}
_TABLE = exit_code_table(README.read_text())


def test_every_row_of_the_exit_code_table_has_a_scenario_and_every_scenario_a_row() -> None:
    assert sorted(_TABLE) == sorted(_SCENARIOS)


@pytest.mark.parametrize("row", sorted(_TABLE))
def test_the_cli_ends_with_the_exit_code_the_readme_table_gives(work: dict[str, str], row: str) -> None:
    env = work
    assert row in _SCENARIOS, f"exit-code row {row!r} ({_TABLE[row]}) has no scenario here"
    _STDERR.clear()
    got = [(what, run(env)) for what, run, _ in _SCENARIOS[row]]
    assert got == [(what, code) for what, _, code in _SCENARIOS[row]], (_TABLE[row], _STDERR)



# -- the Python API example ------------------------------------------------------------------------

PYTHON_MARKER = "<!-- checked: python -->"


def python_example(text: str) -> str:
    """The README's Python block that ``<!-- checked: python -->`` precedes, as printed."""
    lines = text.splitlines()
    start = lines.index(PYTHON_MARKER)
    assert lines[start + 1] == "```python", "the marker must precede a python block"
    end = lines.index("```", start + 2)
    return "\n".join(lines[start + 2:end]) + "\n"


def test_the_readme_python_example_runs_as_printed_and_prints_what_its_comments_say(fresh: dict[str, str]) -> None:
    code = python_example(README.read_text())
    runs = []
    for _ in range(2):  # the second run resumes "work" (the same spec): created is False
        done = subprocess.run([sys.executable, "-c", code], env=fresh, capture_output=True, text=True, timeout=300,
                              check=False)
        assert done.returncode == 0, done.stderr
        runs.append(done.stdout.splitlines())
        cli(fresh, "rm", "work-experiment", "--yes")
    for n, lines in enumerate(runs):
        assert lines[0] == ("True" if n == 0 else "False"), lines
        assert lines[1] == "0 42", lines
        assert any(line.startswith("deleted /usr/bin/git") for line in lines), lines
        assert lines[-5:-1] == ["1", "2", "3", "0"], lines
        assert re.fullmatch(r"0 ck-[0-9a-f]+", lines[-1]), lines
