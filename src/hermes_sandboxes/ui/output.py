"""How both command lines (``hermes-sandboxes`` and ``hermes sandbox``) talk to people and to scripts.

Rich output (colour, boxed tables, spinners) only when the stream is a terminal; otherwise plain,
stable text a script can parse: tables become space-aligned columns with no truncation, spinners
disappear. Primary results (a sandbox name, a checkpoint id, JSON) go to stdout; notes, progress
and errors go to stderr, so ``id=$(hermes-sandboxes checkpoint create box)`` just works.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from hermes_sandboxes.ui.text import printable


class Ui:
    def __init__(self) -> None:
        # file=None makes rich follow sys.stdout/sys.stderr as they are when printing (CliRunner swaps them)
        self.out = Console(highlight=False, soft_wrap=True)
        self.err = Console(stderr=True, highlight=False, soft_wrap=True)

    @property
    def rich(self) -> bool:
        return self.out.is_terminal

    # -- stdout -----------------------------------------------------------------------------------

    def result(self, text: str) -> None:
        """A primary result on stdout, never styled (scripts capture it)."""
        click.echo(printable(text))

    def line(self, text: str = "", style: str | None = None) -> None:
        text = printable(text)
        if self.rich:
            self.out.print(Text(text, style=style or ""))
        else:
            click.echo(text)

    def json(self, data: Any) -> None:
        click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[str]], *, title: str | None = None,
              styles: Sequence[str | None] | None = None) -> None:
        rows = [[printable(cell, newlines=False) for cell in row] for row in rows]
        if self.rich:
            table = Table(title=title, title_justify="left", header_style="bold")
            for header in headers:
                table.add_column(header, overflow="fold")
            for row in rows:
                table.add_row(*(Text(cell, style=(styles[i] if styles else None) or "")
                                for i, cell in enumerate(row)))
            self.out.print(table)
            return
        if title:
            click.echo(title)
        click.echo(plain_table(headers, rows))

    # -- stderr -----------------------------------------------------------------------------------

    def note(self, text: str, style: str | None = None) -> None:
        text = printable(text)
        if self.err.is_terminal:
            self.err.print(Text(text, style=style or "dim"))
        else:
            click.echo(text, err=True)

    @contextlib.contextmanager
    def status(self, text: str) -> Iterator[None]:
        """A spinner on stderr while something slow runs; nothing at all when stderr is not a tty."""
        if not self.err.is_terminal:
            yield
            return
        with self.err.status(text):
            yield


def plain_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(cells, widths, strict=True)).rstrip()
             for cells in [list(headers), *(list(r) for r in rows)]]
    return "\n".join(lines)


def error(message: str) -> None:
    """The one-line error format: ``error: <message>`` on stderr."""
    text = printable(" ".join(str(message).split())) or "unknown error"
    click.echo(f"{click.style('error:', fg='red', bold=True)} {text}", err=True)  # click drops the colour off a tty


def human_size(size: int | None) -> str:
    if size is None:
        return "-"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def signed_size(size: int) -> str:
    return ("+" if size > 0 else "-" if size < 0 else "") + human_size(abs(size))


def age(timestamp: float, now: float | None = None) -> str:
    """``42s``, ``5m``, ``3h``, ``2d``: how long ago, in the largest whole unit."""
    seconds = int(max(0.0, (time.time() if now is None else now) - timestamp))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def clock(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def one_line(text: str, limit: int = 60) -> str:
    flat = printable(" ".join(text.split()))
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


class NotConfirmed(click.UsageError):
    """A destructive command without ``--yes`` where nobody can answer its question (exit 2)."""


def confirm(question: str, *, yes: bool, refusal: str) -> bool:
    """True to go ahead: ``--yes`` was given, or a person at the terminal said yes. When stdin is
    not a terminal (a script, a pipe: ``echo n | ... rm box``) nobody can be asked, so refuse."""
    if yes:
        return True
    if not is_stdin_tty():
        raise NotConfirmed(f"{refusal}: stdin is not a terminal, so nobody can confirm; add --yes")
    return click.confirm(question, err=True)


def is_stdin_tty() -> bool:
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False


def describe_network(name: str, mode: str, allow: Sequence[str]) -> str:
    """One line: the network mode and, with network proxy, the allow-list (``network show`` in both CLIs)."""
    if mode != "proxy":
        return (f"{name}: network {mode} (no allow-list: "
                + ("nothing is reachable)" if mode == "none" else
                   "only its own loopback)" if mode == "loopback" else "everything the host reaches)"))
    return f"{name}: network proxy, allowed: " + (" ".join(allow) or "nothing")


def summary_table(ui: Ui, summary: Mapping[str, Any], *, title: str) -> None:
    """A diff's summary by directory (``DiffSummary.to_dict()``, the form the agent tools and
    ``--json`` give), as both CLIs show it."""
    rows = [[r["path"] + (" (rest)" if r["rest"] else ""), str(r["files"]), str(r["added"]), str(r["modified"]),
             str(r["deleted"]), signed_size(r["net_bytes"])] for r in (*summary["rows"], summary["total"])]
    rows[-1][0] = "total"
    ui.table(["DIRECTORY", "FILES", "ADDED", "MODIFIED", "DELETED", "NET SIZE"], rows, title=title)
