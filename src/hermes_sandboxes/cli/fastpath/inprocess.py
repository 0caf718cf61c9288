"""``exec`` without click, rich or pydantic: the hot path of scripts and agents that call the CLI
once per command.

``try_exec(argv)`` handles the common form, ``[--home DIR] [-b NAME] [--config FILE] exec NAME
[-w DIR] [-e K=V]... [-i] [--timeout S] [--checkpoint P] -- COMMAND...``, when the settings cache
(settings_cache.py) knows the effective settings and the backend can be built from them. For
anything else (help, ``-o``, a malformed option, a cache miss, a backend without ``from_values``)
it returns None before it has done anything, and the full click CLI runs instead: the two paths
share ``running.run_command`` and the same messages and exit codes, so a user cannot tell which ran.
"""

from __future__ import annotations

from hermes_sandboxes.util.values import dataclass, field

_POLICIES = ("risky", "always", "off", "auto")  # (auto: the old word for risky, see cli/session.py)


@dataclass()
class _Exec:
    backend: str | None = None
    config: str | None = None
    home: str | None = None
    name: str | None = None
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    interactive: bool = False
    timeout: float | None = None
    policy: str | None = None  # None: the setting auto_checkpoint
    command: list[str] = field(default_factory=list)


def _value(args: list[str], i: int, long: str, short: str | None) -> tuple[str | None, int]:
    """The value of option ``args[i]`` if it is ``long``/``short`` (``--x V``, ``--x=V``, ``-s V``)."""
    arg = args[i]
    if arg == long or (short is not None and arg == short):
        return (args[i + 1], i + 2) if i + 1 < len(args) else (None, i)
    if arg.startswith(long + "="):
        return arg[len(long) + 1:], i + 1
    return None, i


def _env_pair(pair: str) -> tuple[str, str] | None:
    key, sep, value = pair.partition("=")
    if not sep or not key or not key.replace("_", "a").isalnum() or key[0].isdigit() or not key.isascii():
        return None
    return key, value


def parse(args: list[str]) -> _Exec | None:
    """The exec invocation ``args`` describes, or None when the full CLI should handle them."""
    job, i = _Exec(), 0
    while i < len(args) and args[i] != "exec":
        for long, short, attr in (("--home", None, "home"), ("--backend", "-b", "backend"),
                                  ("--config", None, "config")):
            value, j = _value(args, i, long, short)
            if j != i:
                assert value is not None
                setattr(job, attr, value)
                i = j
                break
        else:
            return None  # -o, --help, --version, another command: the full CLI
    i += 1
    if i >= len(args):
        return None
    while i < len(args) and args[i] != "--":
        arg = args[i]
        if not arg.startswith("-"):
            if job.name is not None:
                return None  # a command without "--": the full CLI says how to write it
            job.name, i = arg, i + 1
            continue
        if arg in ("-i", "--interactive"):
            job.interactive, i = True, i + 1
            continue
        for long, short in (("--cwd", "-w"), ("--env", "-e"), ("--timeout", None), ("--checkpoint", None)):
            value, j = _value(args, i, long, short)
            if j != i:
                break
        else:
            return None
        assert value is not None
        i = j
        if long == "--cwd":
            if not value.startswith("/"):
                return None
            job.cwd = value
        elif long == "--env":
            pair = _env_pair(value)
            if pair is None:
                return None
            job.env[pair[0]] = pair[1]
        elif long == "--timeout":
            try:
                job.timeout = float(value)
            except ValueError:
                return None
            if not job.timeout > 0 or job.timeout == float("inf"):
                return None
        elif value in _POLICIES:
            job.policy = value
        else:
            return None
    job.command = args[i + 1:]
    if job.name is None or not job.command:
        return None
    return job


def try_exec(args: list[str]) -> int | None:
    """Run ``exec`` on the fast path; its exit code, or None to let the full CLI handle ``args``."""
    job = parse(args)
    if job is None:
        return None
    from hermes_sandboxes.cli import signals

    restore = signals.install()
    try:
        return _run(job)
    except KeyboardInterrupt as exc:
        from hermes_sandboxes.ui.text import error

        name = signals.name(exc)
        error("interrupted" if name == "SIGINT" else f"interrupted by {name}")
        return signals.exit_code(exc)
    finally:
        restore()


def _run(job: _Exec) -> int | None:
    from hermes_sandboxes.cli.running import announcer, finish, run_command, stdin_for
    from hermes_sandboxes.cli.session import Workspace
    from hermes_sandboxes.errors import SandboxError
    from hermes_sandboxes.ui.text import error, note

    workspace = Workspace(job.backend, job.config, {"home": job.home} if job.home is not None else {})
    workspace.on_collect = lambda name: note(f"collected {name}, left behind by a run that was killed")
    assert job.name is not None
    command = job.command[0] if len(job.command) == 1 else job.command
    try:
        if not workspace.cached_backend():
            return None
    except SandboxError as exc:  # the backend, not the sandbox: as the full CLI, exit 1
        error(str(exc))
        return 1
    policy = job.policy or workspace.default_policy()
    try:
        session = workspace.session(workspace.sandbox(job.name), policy=policy,  # type: ignore[arg-type]
                                    secrets=job.env)
        try:
            outcome = run_command(session, command, policy=policy, cwd=job.cwd,  # type: ignore[arg-type]
                                  env=job.env, timeout=job.timeout, stdin=stdin_for(job.interactive),
                                  announce=announcer(note, job.name))
        finally:
            session.close()
    except SandboxError as exc:
        error(str(exc))
        return 125
    except OSError as exc:
        error(f"{exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}")
        return 1
    finally:
        workspace.close()
    return finish(note, session, outcome, job.timeout)
