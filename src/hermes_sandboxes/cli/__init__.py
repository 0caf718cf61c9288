"""The ``hermes-sandboxes`` command-line tool (entry point ``hermes_sandboxes.cli:main``).

``main`` answers ``--version`` itself, then offers the call to this user's warm server
(fastpath/warm.py: a client of a few built-in modules; the server keeps the CLI imported and forks
a worker per call), then to the fast path in-process (fastpath/inprocess.py: ``exec`` with the
standard library, the contract and the recorder only), and ``mcp`` to the MCP server without click
(fastpath/mcp.py: its client waits for the first answer); anything else goes to the click
application, imported only then. All of it happens inside a Ctrl-C guard: an interrupt while Python
is still importing ends the command quietly (exit 130), not with a traceback.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the hot path of a CLI exec)
if TYPE_CHECKING:
    from typing import Any, NoReturn

    import click


def main(argv: list[str] | None = None) -> NoReturn:
    try:
        if (sys.argv[1:] if argv is None else argv) == ["--version"]:
            from hermes_sandboxes import __version__

            sys.stdout.write(f"hermes-sandboxes, version {__version__}\n")  # (as click says it)
            sys.exit(0)
        if argv is None and sys.stdout is sys.__stdout__ and sys.stderr is sys.__stderr__:
            # (only as a command: a program that calls main() with its own streams keeps them)
            from hermes_sandboxes.cli.fastpath.warm import run

            code = run(sys.argv[1:])
            if code is not None:
                # the worker did the work and flushed its output; this process wrote nothing and has
                # nothing to tear down: skip the interpreter's finalization (~1.7 ms, a fifth of a
                # bare Python's whole run)
                for stream in (sys.stdout, sys.stderr):
                    if stream is not None:
                        stream.flush()
                os._exit(code)
        from hermes_sandboxes.cli.fastpath.inprocess import try_exec

        code = try_exec(sys.argv[1:] if argv is None else list(argv))
        if code is not None:
            sys.exit(code)
        from hermes_sandboxes.cli.fastpath.mcp import try_mcp  # a client waits for the server's first answer

        code = try_mcp(sys.argv[1:] if argv is None else list(argv))
        if code is not None:
            sys.exit(code)
        from hermes_sandboxes.cli.app import main as app_main
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        sys.exit(130)
    app_main(argv)


def __getattr__(name: str) -> Any:
    if name == "cli":  # the click group, for tests and embedding (imported on first use)
        from hermes_sandboxes.cli.app import cli

        return cli
    raise AttributeError(name)


__all__ = ["cli", "main"]

if TYPE_CHECKING:
    cli: click.Group
