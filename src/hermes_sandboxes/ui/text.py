"""Text for people, with the standard library only (the hot path of ``exec`` uses it; output.py
adds rich's tables and spinners for everything else)."""

from __future__ import annotations

import contextlib
import sys

from hermes_sandboxes.recorder.journal import utf8_safe

_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7f) if c not in (0x09, 0x0a)}
_ANSI = {"dim": "2", "yellow": "33", "green": "32", "red": "31", "bold": "1"}


def printable(text: str, *, newlines: bool = True) -> str:
    """What we print of text that came from a sandbox (paths, commands, comments): invalid UTF-8
    as ``\\xNN`` and control characters escaped, so no terminal escape sequence from inside gets
    through and no byte can make printing fail."""
    safe = utf8_safe(text).translate(_CONTROL)
    return safe if newlines else safe.replace("\n", "\\n")


def _tty(stream: object) -> bool:
    try:
        return bool(getattr(stream, "isatty", lambda: False)())
    except ValueError:
        return False


def note(text: str, style: str | None = None) -> None:
    """A note on stderr: plain for scripts, in ``style`` (default dim) on a terminal."""
    text = printable(text)
    if _tty(sys.stderr):
        text = f"\x1b[{_ANSI.get(style or 'dim', '2')}m{text}\x1b[0m"
    with contextlib.suppress(OSError, ValueError):  # a terminal that hung up
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


def error(message: str) -> None:
    """The one-line error format: ``error: <message>`` on stderr."""
    text = printable(" ".join(str(message).split())) or "unknown error"
    label = "\x1b[31m\x1b[1merror:\x1b[0m" if _tty(sys.stderr) else "error:"
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"{label} {text}\n")
        sys.stderr.flush()
