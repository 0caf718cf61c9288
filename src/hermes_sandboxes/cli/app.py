"""The ``hermes-sandboxes`` command: the click group, global options and error reporting.

Every failure a user can cause ends as one line, ``error: <message>``, on stderr with a non-zero
exit code, never a traceback: SandboxError messages already say what failed and what to do next.
Exit codes: 0 success, 1 an error of ours, 2 bad usage, 130 interrupted; ``exec``, ``run`` and
``shell`` exit with the command's own code, and 125 when the sandbox itself failed (as docker run
does), so a script can tell "the command failed" from "the sandbox failed".
"""

from __future__ import annotations

import sys
from typing import Any, NoReturn

import click

from hermes_sandboxes.cli import checkpoints, sandboxes
from hermes_sandboxes.cli.output import Ui, error
from hermes_sandboxes.cli.session import Workspace
from hermes_sandboxes.errors import SandboxError

EXIT_ERROR = 1
EXIT_INTERRUPTED = 130


class CliGroup(click.Group):
    """A group that reports errors as one line, also when run under click's CliRunner."""

    def main(self, *args: Any, **kwargs: Any) -> NoReturn:
        kwargs["standalone_mode"] = False  # we turn exceptions into exit codes ourselves
        try:
            rv = super().main(*args, **kwargs)
        except click.exceptions.NoArgsIsHelpError as exc:
            click.echo(exc.ctx.get_help() if exc.ctx else "")
            sys.exit(exc.exit_code)
        except click.Abort:  # click turns Ctrl-C and EOF at a prompt into Abort
            error("interrupted")
            sys.exit(EXIT_INTERRUPTED)
        except click.ClickException as exc:
            hint = " (see --help)" if isinstance(exc, click.UsageError) else ""
            error(exc.format_message() + hint)
            sys.exit(exc.exit_code)
        except SandboxError as exc:
            error(str(exc))
            sys.exit(EXIT_ERROR)
        except OSError as exc:  # e.g. an unreadable --home: the user's to fix, not a bug of ours
            error(f"{exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}")
            sys.exit(EXIT_ERROR)
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=CliGroup, no_args_is_help=True,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--home", type=click.Path(file_okay=False), envvar="HERMES_SANDBOXES_HOME",
              help="Where sandboxes live (default $HERMES_SANDBOXES_HOME or /var/lib/hermes-sandboxes).")
@click.version_option(package_name="hermes-sandboxes")
@click.pass_context
def cli(ctx: click.Context, home: str | None) -> None:
    """Sandboxes for an AI agent's shell commands: isolated, persistent or disposable,
    with sub-second checkpoint and restore.

    \b
    Exit codes: 0 success, 1 error, 2 bad usage, 130 interrupted. exec, run and shell
    exit with the command's code (124: timed out), or 125 when the sandbox itself failed.
    """
    ctx.obj = Workspace(home)


@cli.command(short_help="Break a sandbox and roll it back, for real.")
@click.pass_obj
def demo(workspace: Workspace) -> int:
    """Break a sandbox on purpose and roll it back: the rollback story in one minute."""
    from hermes_sandboxes.demo import run_demo

    return run_demo(workspace.backend, Ui())


for command in sandboxes.COMMANDS:
    cli.add_command(command)
cli.add_command(checkpoints.checkpoint)
cli.add_command(checkpoints.log)


def main(argv: list[str] | None = None) -> NoReturn:
    cli.main(args=argv, prog_name="hermes-sandboxes")
