"""Sandbox commands: create, exec, run, shell, fork, ls, rm, stop, doctor."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import click

from hermes_sandboxes import backends
from hermes_sandboxes.cli import signals
from hermes_sandboxes.cli.commands import disk
from hermes_sandboxes.cli.commands.network import checked_hosts
from hermes_sandboxes.cli.running import announcer, finish, run_command, stdin_for
from hermes_sandboxes.cli.session import CLI_POLICIES, OLD_SPELLINGS, Workspace
from hermes_sandboxes.errors import InvalidInput, SandboxError, SandboxNotFound, Unsupported
from hermes_sandboxes.names import validate_name
from hermes_sandboxes.recorder.command import RecordedProcess
from hermes_sandboxes.sandbox import NETWORK_MODES, Capability, Command, Limits, Process, SandboxSpec
from hermes_sandboxes.ui.output import Ui, age, confirm, error, human_size, is_stdin_tty
from hermes_sandboxes.util.units import parse_duration, parse_size

if TYPE_CHECKING:
    from hermes_sandboxes.cli.session import CliPolicy

EXIT_SANDBOX_FAILED = 125  # as `docker run`: the sandbox failed, not the command
EXIT_CANCELLED = 1

# -- shared options ----------------------------------------------------------------------------

F = Callable[..., Any]


def spec_options(func: F) -> F:
    """The options that describe a new sandbox (create and run); unset ones come from the settings."""
    options = [
        click.option("--network", type=click.Choice(NETWORK_MODES), default=None,
                     help="none: no network (the default); loopback: its own 127.0.0.1; host: the host's "
                          "network; proxy: only the hosts given with --allow."),
        click.option("--allow", "allow", multiple=True, metavar="HOST", callback=checked_hosts,
                     help="With --network proxy: a host (*.wildcards, :port, IPs) it may reach (repeatable)."),
        click.option("--memory", metavar="SIZE", help="Memory limit, e.g. 512M or 2G."),
        click.option("--pids", type=click.IntRange(min=1), help="Most processes at once."),
        click.option("--cpus", type=click.FloatRange(min=0, min_open=True), help="CPU share, e.g. 1.5."),
        click.option("--disk", metavar="SIZE", help="Disk limit, e.g. 10G, checkpoints' data included "
                                                    "(local backend: the btrfs store on Linux >= 6.7)."),
        click.option("--base", metavar="DIR", help="Backend setting 'base': root filesystem directory to build on "
                                                   "(local backend; default the host's /)."),
        click.option("--mask", "masks", multiple=True, metavar="PATH",
                     help="Backend setting 'masks': another host path to hide inside (repeatable)."),
        click.option("--idle-timeout", metavar="DURATION",
                     help="Stop the sandbox after this long without a command, e.g. 30m (files and "
                          "checkpoints stay; the next command starts it again). Setting 'idle_timeout'."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def command_options(func: F) -> F:
    options = [
        click.option("--cwd", "-w", metavar="DIR", help="Working directory inside (default /root)."),
        click.option("--env", "-e", "env_pairs", multiple=True, metavar="K=V",
                     help="Environment variable (repeatable)."),
        click.option("--interactive", "-i", is_flag=True,
                     help="Pass stdin to the command also when it is a terminal (when it is not, a pipe or "
                          "a file, it is always passed on, streamed, with its end-of-file)."),
        click.option("--timeout", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
                     help="Kill the command and everything it started after this long (exit 124)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def build_spec(workspace: Workspace, network: str | None, allow: tuple[str, ...], memory: str | None,
               pids: int | None, cpus: float | None, base: str | None, masks: tuple[str, ...],
               disk: str | None = None, idle_timeout: str | None = None) -> SandboxSpec:
    """The settings' spec with the flags laid over it; ``--base``/``--mask`` are backend settings."""
    try:
        memory_bytes = parse_size(memory, unit_required=True) if memory is not None else None
    except InvalidInput as exc:  # as the settings say it: a bare number is ambiguous
        raise click.BadParameter(str(exc), param_hint="'--memory'") from None
    try:
        disk_bytes = parse_size(disk, unit_required=True) if disk is not None else None
    except InvalidInput as exc:
        raise click.BadParameter(str(exc), param_hint="'--disk'") from None
    try:
        idle = parse_duration(idle_timeout) if idle_timeout is not None else None
    except InvalidInput as exc:
        raise click.BadParameter(str(exc), param_hint="'--idle-timeout'") from None
    workspace.override({"base": "--base", "masks": "--mask"}, base=base, masks=list(masks))
    default = workspace.effective.settings.spec()
    limits = default.limits
    return replace(
        default,
        network=network or default.network,  # type: ignore[arg-type]
        allow=tuple(allow) or default.allow,
        limits=Limits(memory_bytes if memory_bytes is not None else limits.memory_bytes,
                      pids or limits.pids, cpus or limits.cpus,
                      disk_bytes if disk_bytes is not None else limits.disk_bytes),
        idle_timeout=idle if idle is not None else default.idle_timeout,
    )


def parse_env(pairs: tuple[str, ...]) -> dict[str, str]:
    """``--env`` pairs; a malformed one is a usage error (exit 2), found before anything runs."""
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key or not key.replace("_", "a").isalnum() or key[0].isdigit():
            raise click.BadParameter(f"takes NAME=VALUE with a shell-style NAME, got {pair!r}",
                                     param_hint="'--env' / '-e'")
        env[key] = value
    return env


def check_cwd(cwd: str | None) -> None:
    if cwd is not None and not cwd.startswith("/"):
        raise click.BadParameter(f"must be an absolute path inside the sandbox, got {cwd!r}",
                                 param_hint="'--cwd' / '-w'")


def to_command(args: tuple[str, ...]) -> Command:
    """One argument is a shell command line (``"ls | wc -l"``); several are an argv, run as is."""
    if not args:
        raise click.UsageError("no command given: put it after --, e.g. exec box -- ls -la")
    return args[0] if len(args) == 1 else list(args)


@contextlib.contextmanager
def _exit_125_on_error() -> Iterator[None]:
    """In commands that exit with their command's code, our own failures exit 125 (as `docker run`)
    so that they cannot be mistaken for the command's."""
    try:
        yield
    except SandboxError as exc:
        from hermes_sandboxes.settings import InvalidSettings

        if isinstance(exc, InvalidSettings):
            raise  # not the sandbox: a bad flag (exit 2) or a bad config file or variable (exit 1)
        error(str(exc))
        sys.exit(EXIT_SANDBOX_FAILED)


# -- commands ----------------------------------------------------------------------------------


@click.command(short_help="Create a sandbox.")
@click.argument("name")
@click.option("--ephemeral", is_flag=True, help="Never adopted by another run; remove it when done.")
@spec_options
@click.pass_obj
def create(workspace: Workspace, /, name: str, ephemeral: bool, **spec: Any) -> None:
    """Create the sandbox NAME (prints its name)."""
    ui = Ui()
    validate_name(name)
    sandbox_spec = build_spec(workspace, **spec)
    with ui.status(f"creating sandbox {name}…"):
        sandbox = workspace.backend.create(name, sandbox_spec, ephemeral=ephemeral)
    session = workspace.session(sandbox)
    session.record_create()
    session.close()
    ui.result(name)


class PolicyChoice(click.Choice):  # type: ignore[type-arg]
    """The checkpoint policies, and the CLI's old word for one (``auto``, taken for ``risky``)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        return super().convert(OLD_SPELLINGS.get(value, value), param, ctx)


@click.command(name="exec", short_help="Run a command in a sandbox.")
@click.argument("name")
@command_options
@click.option("--checkpoint", "policy", type=PolicyChoice(CLI_POLICIES), default=None,
              help="Checkpoint first: risky = before risky commands (rm -rf, git reset --hard, ...), "
                   "always, or off (default: the setting auto_checkpoint, whose names these are; auto is "
                   "taken for risky).")
@click.argument("command", nargs=-1, required=True)
@click.pass_obj
def exec_(workspace: Workspace, name: str, cwd: str | None, env_pairs: tuple[str, ...],
          interactive: bool, timeout: float | None, policy: CliPolicy | None, command: tuple[str, ...]) -> int:
    """Run a command in NAME, streaming its output (and stdin, when it is not a terminal);
    exits with its exit code.

    \b
      hermes-sandboxes exec box -- ls -la /root      (several arguments: run as is)
      hermes-sandboxes exec box -- 'make && ./app'   (one argument: a shell command line)
      tar c src | hermes-sandboxes exec box -- tar x -C /root
    """
    ui = Ui()
    cmd, env = to_command(command), parse_env(env_pairs)
    check_cwd(cwd)
    workspace.backend  # noqa: B018 - settings and backend errors are ours (exit 1), not the sandbox's
    policy = policy or workspace.default_policy()
    with _exit_125_on_error():
        session = workspace.session(workspace.sandbox(name), policy=policy, secrets=env)
        try:
            outcome = run_command(session, cmd, policy=policy, cwd=cwd, env=env, timeout=timeout,
                                  stdin=stdin_for(interactive), announce=announcer(ui.note, name))
        finally:
            session.close()
    return finish(ui.note, session, outcome, timeout)


@click.command(short_help="Run a command in a throw-away sandbox.")
@spec_options
@command_options
@click.argument("command", nargs=-1, required=True)
@click.pass_obj
def run(workspace: Workspace, /, cwd: str | None, env_pairs: tuple[str, ...], interactive: bool,
        timeout: float | None, command: tuple[str, ...], **spec: Any) -> int:
    """Run a command in a new ephemeral sandbox, then destroy it (also on failure, Ctrl-C, SIGTERM
    or SIGHUP; after a kill -9, the next hermes-sandboxes command or `gc` collects it)."""
    ui = Ui()
    cmd, env = to_command(command), parse_env(env_pairs)
    check_cwd(cwd)
    with _exit_125_on_error():
        sandbox_spec = build_spec(workspace, **spec)
        with ui.status("creating an ephemeral sandbox…"):
            sandbox = workspace.create_owned(sandbox_spec)
        session = workspace.session(sandbox, secrets=env)
        try:
            session.record_create()
            outcome = run_command(session, cmd, policy="off", cwd=cwd, env=env, timeout=timeout,
                                  stdin=stdin_for(interactive), announce=announcer(ui.note, sandbox.name))
        finally:
            with signals.held(), ui.status(f"destroying {sandbox.name}…"):
                session.destroy()
                workspace.release(sandbox.name)
    return finish(ui.note, session, outcome, timeout)


@click.command(short_help="Interactive bash inside a sandbox.")
@click.argument("name")
@click.pass_obj
def shell(workspace: Workspace, name: str) -> int:
    """An interactive bash inside NAME (a script when stdin is not a terminal)."""
    from hermes_sandboxes.cli.terminal import interactive, run_shell

    with _exit_125_on_error():
        sandbox = workspace.sandbox(name)
        if Capability.TERMINAL not in workspace.backend.capabilities:
            raise Unsupported(f"the {workspace.backend.name} backend has no interactive terminal; "
                              f"use: hermes-sandboxes exec {name} -- COMMAND")
        session = workspace.session(sandbox)
        label = "(interactive shell)" if interactive() else "(shell script from stdin)"
        started: list[RecordedProcess] = []

        def attach(command: str, fds: tuple[int, int, int], *, cwd: str | None = None,
                   env: dict[str, str] | None = None) -> Process:
            # written ahead like any command (lost if we die, then stopped by the next call); never
            # checkpointed: what it will run is not known yet
            started.append(session.recorded.attach(command, fds, cwd=cwd, env=env, record_as=label,
                                                   checkpoint="off"))
            return started[-1]

        try:
            return run_shell(sandbox, attach)
        except KeyboardInterrupt as exc:  # a signal (SIGTERM...) while it ran: run_shell has killed it
            for proc in started:  # (a no-op when its end is recorded already: it ended first)
                proc.record(None, killed=True, error=f"interrupted by {signals.name(exc)}")
            raise
        finally:
            session.close()


@click.command(name="ls")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def ls(workspace: Workspace, as_json: bool) -> None:
    """List sandboxes."""
    ui = Ui()
    infos = workspace.backend.list()
    if as_json:
        ui.json([{**info.to_dict(), "last_used": disk.last_used(workspace, info)} for info in infos])
        return
    if not infos:
        ui.note("no sandboxes; create one with: hermes-sandboxes create NAME")
        return
    rows = [[i.name, str(i.state), "ephemeral" if i.ephemeral else "persistent", age(i.created_at),
             age(disk.last_used(workspace, i)), i.spec.network, human_size(i.layer_bytes), str(i.checkpoint_count)]
            for i in infos]
    ui.table(["NAME", "STATE", "KIND", "AGE", "LAST USED", "NETWORK", "CHANGED", "CHECKPOINTS"], rows)


@click.command(short_help="Destroy a sandbox.")
@click.argument("name")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def rm(workspace: Workspace, name: str, yes: bool) -> int:
    """Destroy NAME with its processes, files and checkpoints."""
    ui = Ui()
    sandbox = workspace.sandbox(name)
    if not yes:
        count = 0
        if is_stdin_tty():
            with contextlib.suppress(SandboxNotFound):  # a broken sandbox (a killed create) has none
                count = len(sandbox.checkpoints())
        if not confirm(f"Destroy sandbox {name} and its {count} checkpoint(s)?", yes=yes,
                       refusal=f"not destroying {name}"):
            error("cancelled; nothing was changed")
            return EXIT_CANCELLED
    session = workspace.session(sandbox)
    with signals.held(), ui.status(f"destroying {name}…"):
        session.destroy()
    session.close()
    ui.note(f"destroyed {name}")
    return 0


@click.command(short_help="Stop a sandbox's processes (files stay).")
@click.argument("name")
@click.pass_obj
def stop(workspace: Workspace, name: str) -> None:
    """Stop every process in NAME; its files stay, the next command starts it again."""
    sandbox = workspace.sandbox(name)
    sandbox.stop()
    Ui().note(f"stopped {name}")


@click.command(short_help="A new sandbox from another's checkpoint.")
@click.argument("source")
@click.argument("rest", nargs=-1, required=True, metavar="[CHECKPOINT] NEW")
@click.pass_obj
def fork(workspace: Workspace, source: str, rest: tuple[str, ...]) -> None:
    """Create the sandbox NEW with the files of SOURCE's CHECKPOINT (or of SOURCE as it is now);
    SOURCE is untouched and both run independently. Prints NEW."""
    if len(rest) > 2:
        raise click.UsageError("fork takes SOURCE [CHECKPOINT] NEW")
    checkpoint_id, new = (rest[0], rest[1]) if len(rest) == 2 else (None, rest[0])
    validate_name(new)
    ui = Ui()
    sandbox = workspace.sandbox(source)
    backend = workspace.backend
    if Capability.FORK not in backend.capabilities:
        raise Unsupported(f"the {backend.name} backend cannot fork sandboxes; nothing was changed")
    with ui.status(f"forking {source} into {new}…"):
        forked = sandbox.fork(new, checkpoint_id)
    session = workspace.session(forked)
    session.record_create(forked_from=source if checkpoint_id is None else f"{source}@{checkpoint_id}")
    session.close()
    origin = workspace.session(sandbox)  # the source's trail says it too
    origin.recorded.record_fork(new, checkpoint_id)
    origin.close()
    ui.result(new)


@click.command(short_help="Remove what killed runs left behind (and, asked, unused sandboxes).")
@click.option("--unused-for", metavar="DURATION",
              help="Also list the persistent sandboxes not used for this long (e.g. 14d) and destroy them: "
                   "after a yes at the terminal, or with --yes.")
@click.option("--yes", "-y", is_flag=True, help="With --unused-for: destroy without asking.")
@click.pass_obj
def gc(workspace: Workspace, unused_for: str | None, yes: bool) -> int:
    """Destroy the sandboxes of `run`s whose process died without cleaning up (kill -9, a crash),
    and stop and record as lost the commands whose CLI died before they ended. Any command that uses
    the backend collects such sandboxes too, and any that uses a sandbox settles its lost commands;
    gc does this for all of them. With --unused-for, persistent sandboxes last used longer ago than
    that (see LAST USED in ls) are listed and, once confirmed, destroyed with their checkpoints."""
    workspace.collect_orphans = False
    collected = workspace.collect()
    ui = Ui()
    ui.note(f"collected {len(collected)} sandbox(es) left by killed runs"
            + (f": {', '.join(collected)}" if collected else ""))
    settled = workspace.settle()
    if settled:
        ui.note(f"recorded lost commands (their CLI died before they ended; those still running were "
                f"stopped) in: {', '.join(settled)}")
    return 0 if unused_for is None else disk.collect_unused(workspace, unused_for, yes)


@click.command(short_help="What works here, per backend, and why not.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def doctor(workspace: Workspace, as_json: bool) -> int:
    """What works on this machine, per backend, and why not; exit 1 if the chosen backend cannot
    run here. Read-only: a store not made yet is described (what the first sandbox will create)."""
    ui = Ui()
    workspace.collect_orphans = False  # doctor changes nothing: no collection, no store made
    chosen = workspace.effective.backend
    rows: list[dict[str, Any]] = []
    with ui.status("checking this machine…"):
        for name in backends.names():
            missing = backends.missing_dependency(name)
            if name != chosen:
                rows.append({"backend": name, "ok": missing is None, "label": "installed",
                             "detail": missing or "its dependencies are installed (not the chosen backend)"})
                continue
            rows.extend({"backend": name, **check} for check in _chosen_checks(workspace, missing))
    problem = next((r["detail"] for r in rows if r["backend"] == chosen and not r["ok"]), None)
    if as_json:
        ui.json({"backend": chosen, "usable": problem is None, "problem": problem, "checks": rows})
    else:
        ui.table(["", "BACKEND", "CHECK", "DETAIL"],
                 [["ok" if r["ok"] else "FAIL", r["backend"], r["label"], r["detail"]] for r in rows])
        if problem is None:
            ui.note(f"{chosen} sandboxes work here", style="green")
        else:
            error(f"{chosen} sandboxes cannot run here: {problem}")
    return 0 if problem is None else 1


def _chosen_checks(workspace: Workspace, missing: str | None) -> list[dict[str, Any]]:
    if missing is not None:
        return [{"ok": False, "label": "installed", "detail": missing}]
    try:
        backend = workspace.backend
    except SandboxError as exc:
        return [{"ok": False, "label": "settings", "detail": str(exc)}]
    reason = backend.unavailable_reason()
    checks = [{"ok": reason is None, "label": "usable", "detail": reason or "can run here"}]
    if reason is None:
        try:
            checks += [{"ok": c.ok, "label": c.label, "detail": c.detail} for c in backend.doctor()]
        except Exception as exc:  # whatever the backend's own checks raised, doctor reports it
            checks.append({"ok": False, "label": "backend", "detail": f"{type(exc).__name__}: {exc}"})
    return checks


COMMANDS = (create, exec_, run, shell, fork, ls, rm, stop, gc, disk.df, doctor)
