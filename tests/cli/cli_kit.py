"""What the CLI tests share: the fixtures ``home`` and ``box`` and helpers to run the command.

Commands run in-process through click's CliRunner (``hs``, ``ok``, ``as_json``); what needs a real
process (live streaming, signals, a terminal) runs ``CLI`` as a subprocess, on a ``Pty`` where a
terminal is the point. Not a plugin: a test module imports what it uses, and binds the fixtures
under their own names (``home, box = cli_kit.home, cli_kit.box``) so that pytest finds them there.
Its asserts are not rewritten by pytest, so each one says what it saw.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from hermes_sandboxes.backends.local import LocalBackend, LocalSandbox
from hermes_sandboxes.cli import cli
from hermes_sandboxes.names import unique_name
from tests.interrupts import interruptible

CLI = [sys.executable, "-m", "hermes_sandboxes.cli"]



@pytest.fixture
def home(local_backend: LocalBackend) -> Path:
    local_backend.store  # noqa: B018 - open the store here, so the session fixture unmounts it
    return local_backend.home


@pytest.fixture
def box(local_backend: LocalBackend) -> Iterator[LocalSandbox]:
    sandbox = local_backend.create(unique_name("cli"))
    try:
        yield sandbox
    finally:
        sandbox.destroy()


def hs(home: Path, *args: str, input: str | None = None, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, ["--home", str(home), *args], input=input, env=env,
                              catch_exceptions=False)


def ok(home: Path, *args: str, **kwargs: Any) -> Result:
    result = hs(home, *args, **kwargs)
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr)
    return result


def as_json(home: Path, *args: str) -> Any:
    return json.loads(ok(home, *args, "--json").stdout)


def state(home: Path, *names: str) -> list[str]:
    """What an error must leave as it was: the listing and each named sandbox's checkpoints."""
    return [ok(home, "ls", "--json").stdout,
            *(ok(home, "checkpoint", "list", name, "--json").stdout for name in names)]


def assert_one_line_error(result: Result, *, exit_code: int | None = None, says: str = "") -> None:
    assert result.exit_code != 0, result.stdout
    if exit_code is not None:
        assert result.exit_code == exit_code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output, result.output
    assert says.lower() in lines[0].lower(), (says, lines[0])


def checkpoint_ids(home: Path, name: str) -> list[str]:
    return [c["id"] for c in as_json(home, "checkpoint", "list", name)]


class Pty:
    """A subprocess whose stdin, stdout and stderr are a terminal we drive."""

    def __init__(self, args: list[str], *, rows_cols: tuple[int, int] | None = None,
                 env: dict[str, str] | None = None) -> None:
        """With ``rows_cols`` the terminal has that size and is the process's controlling terminal
        (util-linux's setsid --ctty), so resizing it sends SIGWINCH, as a terminal emulator's does.
        ``env`` adds to our environment."""
        self.master, slave = os.openpty()
        args = interruptible(args)  # as a terminal's shell starts a command: Ctrl-C is a key here
        if rows_cols is not None:
            self.resize(*rows_cols)
            args = ["setsid", "--ctty", *args]  # not a group leader: setsid execs in place, same pid
        self.proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave,
                                     start_new_session=rows_cols is None,
                                     env={**os.environ, **env} if env else None)
        os.close(slave)
        self.seen = b""

    def resize(self, rows: int, cols: int) -> None:
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def expect(self, text: bytes, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.seen:
            assert time.monotonic() < deadline, f"never saw {text!r} in {self.seen!r}"
            if not self._read(0.2):
                assert self.proc.poll() is None, f"exited before {text!r}: {self.seen!r}"

    def send(self, data: bytes) -> None:
        os.write(self.master, data)

    def finish(self, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None or self._read(0):
            assert time.monotonic() < deadline, f"still running: {self.seen!r}"
            self._read(0.2)
        os.close(self.master)
        return self.proc.returncode

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return False
        try:
            data = os.read(self.master, 65536)
        except OSError:  # EIO: the terminal's last user has gone
            return False
        self.seen += data
        return bool(data)
