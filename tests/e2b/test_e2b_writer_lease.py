"""Two real Hermes processes on one E2B sandbox scope: the first to start is the writer (it syncs
~/.hermes), the other runs commands as a reader, is refused while the writer's sync has failed, and
takes over (pushing everything) once the writer exits. The fake E2B runs in this process; the other
Hermes reaches it over loopback like this one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.e2b import FakeE2B

pytest_plugins = ["tests.e2b.test_e2b_hermes_plugin"]  # its hermes_home fixture: one profile, one key

TASK = "t-lease"
_OTHER = textwrap.dedent(f"""
    import json, sys
    from hermes_cli.plugins import discover_plugins
    discover_plugins(force=True)
    from model_tools import handle_function_call
    from tools.terminal_tool import cleanup_all_environments
    print("up", flush=True)
    for line in sys.stdin:
        result = handle_function_call("terminal", {{"command": line.strip()}}, task_id={TASK!r})
        print(json.dumps(json.loads(result)), flush=True)
    cleanup_all_environments()
""")


class OtherHermes:
    """A second Hermes process; ``run(command)`` runs its terminal tool there and returns the result."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _OTHER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "up", self.proc.stderr

    def run(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, self.proc.stderr.read() if self.proc.stderr else "no output"
        result: dict[str, Any] = json.loads(line)
        return result

    def exit(self) -> None:
        self.proc.communicate(timeout=120)
        assert self.proc.returncode == 0


@pytest.fixture
def other(hermes_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[OtherHermes]:
    monkeypatch.setenv("HERMES_FORCE_FILE_SYNC", "1")  # Hermes's own knob: sync at every command, both processes
    started = OtherHermes()
    try:
        yield started
    finally:
        if started.proc.poll() is None:
            started.proc.kill()
            started.proc.wait()


def run_here(command: str) -> dict[str, Any]:
    from model_tools import handle_function_call

    result: dict[str, Any] = json.loads(handle_function_call("terminal", {"command": command}, task_id=TASK))
    return result


def writes(fake: FakeE2B) -> int:
    return len(fake.calls("POST", "/files"))


def test_one_writer_syncs_readers_fail_closed_on_dirty_state_and_take_over(
        fake: FakeE2B, hermes_home: Path, other: OtherHermes) -> None:
    skill = hermes_home / "skills" / "notes" / "SKILL.md"
    skill.parent.mkdir(parents=True)
    skill.write_text("v1\n")
    assert other.run("echo one")["output"].strip() == "one"  # the writer: it pushed the skill
    assert writes(fake) >= 1 and len(fake.sandboxes()) == 1
    fake.clear_requests()
    ran = run_here("cat /home/user/.hermes/skills/notes/SKILL.md")  # a reader: same sandbox, no push
    assert ran["output"].strip() == "v1" and writes(fake) == 0, ran
    assert len(fake.sandboxes()) == 1

    skill.write_text("v2\n")
    fake.fail("POST", "/files", 500, times=100)
    failed = other.run("echo never")  # the writer's sync fails: command refused, the scope dirty
    assert "never" not in json.dumps(failed) and "file sync" in json.dumps(failed), failed
    fake.world.faults.clear()
    refused = json.dumps(run_here("echo refused"))
    assert "marked dirty" in refused and "retry" in refused, refused

    assert other.run("echo two")["output"].strip() == "two"  # the writer's sync works again: clean
    assert run_here("cat /home/user/.hermes/skills/notes/SKILL.md")["output"].strip() == "v2"
    other.exit()  # the writer releases its lease
    skill.write_text("v3\n")
    fake.clear_requests()
    took_over = run_here("cat /home/user/.hermes/skills/notes/SKILL.md")
    assert took_over["output"].strip() == "v3" and writes(fake) >= 1, took_over
    from tools.terminal_tool import cleanup_all_environments

    leases = Path(os.environ["HERMES_SANDBOXES_STATE"]) / "leases"
    assert list(leases.iterdir())  # this process's lease and markers
    cleanup_all_environments()  # the last holder lets go: it leaves no lease files behind
    assert not list(leases.iterdir())
