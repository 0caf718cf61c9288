"""The ``hermes-sandboxes`` command: the click group, global options and error reporting.

Every failure a user can cause ends as one line, ``error: <message>``, on stderr with a non-zero
exit code, never a traceback: SandboxError messages already say what failed and what to do next.
Exit codes: 0 success, 1 an error of ours, 2 bad usage (a malformed option, or a destructive
command without ``--yes`` when nobody can be asked); 128+N when signal N stopped us (130 Ctrl-C,
143 SIGTERM, 129 SIGHUP), 141 when our output's reader went away; ``exec``, ``run`` and ``shell``
exit with the command's own code (124: timed out), and 125 when the sandbox itself failed (as
docker run does), so a script can tell "the command failed" from "the sandbox failed".
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, NoReturn

import click

from hermes_sandboxes import __version__
from hermes_sandboxes.cli import signals
from hermes_sandboxes.cli.commands import apparmor, checkpoints, mcp, network, sandboxes, store
from hermes_sandboxes.cli.config import parse_overrides
from hermes_sandboxes.cli.session import Workspace
from hermes_sandboxes.errors import CheckpointNotFound, SandboxError
from hermes_sandboxes.settings import InvalidOption
from hermes_sandboxes.ui.output import NotConfirmed, Ui, error

EXIT_ERROR = 1
EXIT_USAGE = 2  # also for a bad -o, --home, --base, --backend or --config (settings.InvalidOption)
_SEE_HELP = " (see --help)"


class CliGroup(click.Group):
    """A group that reports errors as one line, also when run under click's CliRunner."""

    def main(self, *args: Any, **kwargs: Any) -> NoReturn:
        kwargs["standalone_mode"] = False  # we turn exceptions into exit codes ourselves
        restore = signals.install()
        try:
            sys.exit(self._main(*args, **kwargs))
        finally:
            restore()

    def _main(self, *args: Any, **kwargs: Any) -> int:
        try:
            rv = super().main(*args, **kwargs)
        except click.exceptions.NoArgsIsHelpError as exc:
            click.echo(exc.ctx.get_help() if exc.ctx else "")
            return exc.exit_code
        except (KeyboardInterrupt, click.Abort) as exc:  # click turns Ctrl-C at a prompt into Abort
            interrupted(exc)
            return signals.exit_code(exc)
        except click.ClickException as exc:
            error(exc.format_message() + _usage_hint(exc))
            return exc.exit_code
        except InvalidOption as exc:  # -o KEY=VALUE on the command line: bad usage, as click's own
            error(f"{exc}{_SEE_HELP}")
            return EXIT_USAGE
        except SandboxError as exc:
            error(str(exc) + _listing_hint(exc))
            return EXIT_ERROR
        except OSError as exc:  # e.g. an unreadable --home: the user's to fix, not a bug of ours
            error(f"{exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}")
            return EXIT_ERROR
        return rv if isinstance(rv, int) else 0


def interrupted(exc: BaseException) -> None:
    """``error: interrupted`` (naming the signal when it was not Ctrl-C), even to a terminal that hung up."""
    name = signals.name(exc)
    with contextlib.suppress(OSError, ValueError):
        error("interrupted" if name == "SIGINT" else f"interrupted by {name}")


def _listing_hint(exc: SandboxError) -> str:
    """How to see the checkpoints an unknown id was not among (the recorder names no face's way)."""
    if isinstance(exc, CheckpointNotFound) and exc.sandbox is not None:
        return f"; list them with: hermes-sandboxes checkpoint list {exc.sandbox}"
    return ""


def _usage_hint(exc: click.ClickException) -> str:
    if not isinstance(exc, click.UsageError) or isinstance(exc, NotConfirmed):
        return ""
    command = exc.ctx.command.name if exc.ctx is not None else None
    if isinstance(exc, click.NoSuchOption) and command in ("exec", "run"):
        # `exec box ls -la`: the command's own options were read as ours
        name = "NAME " if command == "exec" else ""
        return f" (put the command after --, e.g. hermes-sandboxes {command} {name}-- ls -la)"
    return _SEE_HELP


@click.group(cls=CliGroup, no_args_is_help=True,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--backend", "-b", metavar="NAME",  # ($HERMES_SANDBOXES_BACKEND: read by config.py, to name it)
              help="Where sandboxes live: local (default), sprites or e2b ($HERMES_SANDBOXES_BACKEND; "
                   "else 'backend' in the config file).")
@click.option("--config", "config_path", metavar="FILE",
              help="Settings file (TOML; else $HERMES_SANDBOXES_CONFIG, else ~/.config/hermes-sandboxes/"
                   "config.toml, the only one that may be missing).")
@click.option("--option", "-o", "options", multiple=True, metavar="KEY=VALUE",
              help="Override one of the backend's settings (repeatable), e.g. -o network=loopback.")
@click.option("--home", type=click.Path(file_okay=False),
              help="Local backend: where sandboxes live (setting 'home'; default $HERMES_SANDBOXES_HOME, "
                   "else /var/lib/hermes-sandboxes as root, ~/.local/share/hermes-sandboxes as anyone else).")
@click.version_option(version=__version__, prog_name="hermes-sandboxes")
@click.pass_context
def cli(ctx: click.Context, backend: str | None, config_path: str | None, options: tuple[str, ...],
        home: str | None) -> None:
    """Sandboxes for an AI agent's shell commands: isolated, persistent or disposable,
    with sub-second checkpoint and restore.

    \b
    Exit codes: 0 success, 1 error, 2 bad usage, 130/143/129 stopped by SIGINT/TERM/HUP,
    141 output pipe closed. exec, run and shell exit with the command's code
    (124: timed out), or 125 when the sandbox itself failed.
    """
    overrides = parse_overrides(options)
    labels = {}
    if home is not None:
        overrides["home"], labels["home"] = home, "--home"
    ctx.obj = Workspace(backend, config_path, overrides, labels)
    ctx.obj.on_collect = lambda name: Ui().note(f"collected {name}, left behind by a run that was killed")
    ctx.call_on_close(ctx.obj.close)


@cli.command(short_help="Break a sandbox and roll it back, for real.")
@click.pass_obj
def demo(workspace: Workspace) -> int:
    """Break a sandbox on purpose and roll it back: the rollback story in one minute."""
    from hermes_sandboxes.cli.commands.demo import run_demo

    return run_demo(workspace.backend, Ui(), workspace.state)


@cli.command(name="config", short_help="The effective backend and settings, and where each came from.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (sizes in bytes).")
@click.pass_obj
def show_config(workspace: Workspace, as_json: bool) -> None:
    """The chosen backend and its effective settings (flags over the config file over defaults),
    each with where its value came from; secrets redacted."""
    from hermes_sandboxes.cli.settings_view import rows, view

    effective = workspace.effective
    data = view(effective, workspace.state.root)
    if as_json:
        Ui().json(data)
        return
    Ui().table(["SETTING", "VALUE", "SOURCE"], rows(effective, data))


for command in sandboxes.COMMANDS:
    cli.add_command(command)
cli.add_command(checkpoints.checkpoint)
cli.add_command(checkpoints.log)
cli.add_command(network.network)
cli.add_command(store.store)
cli.add_command(mcp.mcp)
cli.add_command(apparmor.setup_apparmor)


def main(argv: list[str] | None = None) -> NoReturn:
    cli.main(args=argv, prog_name="hermes-sandboxes")
