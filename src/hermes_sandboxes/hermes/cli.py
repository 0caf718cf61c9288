"""``hermes sandbox ...``: the user's view of this profile's sandboxes from inside Hermes.

It acts on the active terminal backend when that is one of ours (else on the first of our providers
this Hermes loaded). ``list`` shows the sandboxes under the install's ``name_prefix``;
``checkpoints``, ``diff`` and ``restore`` act on one of them, by default the profile's default sandbox
(the one the CLI and cron use). ``network`` shows or changes a sandbox's egress allow-list (network
``proxy``) in place, for its next connection, and the change is recorded; a change made here is
kept when the plugin resumes the sandbox with another ``allow`` setting (see hermes/allowlist.py). A name
outside the prefix is refused, like everywhere else in the plugin.

One output model for both faces: each command builds the dict the agent tools answer with
(tools.py: ``checkpoints``, ``diff`` and ``restore`` give the fields of ``sandbox_checkpoints``,
``sandbox_diff`` and ``sandbox_restore``, ``discarded_commands`` a list); ``--json`` prints it, and
by default it is shown as hermes-sandboxes shows the same things (tables, plain columns when stdout is
not a terminal; results on stdout, notes on stderr). Errors are one line ``error: ...`` on stderr;
exit 1 for an error or a restore refused at the prompt, 2 for bad usage (argparse's, a missing HOST, a
restore without --yes where nobody can confirm), as hermes-sandboxes does.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hermes_sandboxes.errors import CheckpointNotFound, SandboxError
from hermes_sandboxes.hermes import naming, tools
from hermes_sandboxes.hermes.providers.registry import active, registered
from hermes_sandboxes.recorder.credentials import Redactor
from hermes_sandboxes.recorder.sandbox import RecordedSandbox
from hermes_sandboxes.ui.output import Ui, age, describe_network, error, human_size, one_line, summary_table

if TYPE_CHECKING:
    from hermes_sandboxes.hermes.providers.base import SandboxProvider


def _setup(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="sandbox_command", required=True)
    _json(sub.add_parser("list", help="sandboxes under this install's name_prefix"))
    for command, help_text in (("checkpoints", "checkpoints with their story"),
                               ("diff", "files changed since a checkpoint"),
                               ("restore", "roll a sandbox back to a checkpoint")):
        p = sub.add_parser(command, help=help_text)
        if command != "checkpoints":
            p.add_argument("checkpoint", help="checkpoint id")
        if command == "restore":
            p.add_argument("--yes", "-y", action="store_true",
                           help="restore without asking (needed when stdin is not a terminal)")
        p.add_argument("--sandbox", help="sandbox name (default: this profile's default sandbox)")
        _json(p)
    p = sub.add_parser("network", help="show or change a sandbox's egress allow-list (network proxy)")
    p.add_argument("action", choices=("show", "allow", "deny", "set"),
                   help="show it; allow or deny entries; set: replace the list")
    p.add_argument("hosts", nargs="*", metavar="HOST", help="allow-list entries (pypi.org, *.example.com, "
                                                            "127.0.0.1:8080, @pypi)")
    p.add_argument("--sandbox", help="sandbox name (default: this profile's default sandbox)")
    _json(p)


def _json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", dest="as_json",
                        help="machine-readable: the fields the agent tools answer with")


def _recorded(provider: SandboxProvider, name: str | None) -> RecordedSandbox:
    settings = provider.settings()
    backend = provider.backend(settings)
    prefix = settings.name_prefix
    if name is None:
        key = naming.task_key_for_scope("default", settings.scope)
        name = provider.persistent_name(prefix, naming.resolve_profile(), key)
    sandbox = backend.get(naming.require_within_prefix(prefix, name))
    return provider.recorded(sandbox, settings, Redactor())


def _provider() -> SandboxProvider:
    chosen = active() or next(iter(registered().values()), None)
    if chosen is None:
        raise SandboxError("no hermes-sandboxes backend is loaded; enable one in plugins.enabled")
    return chosen


# as hermes-sandboxes: 2 for bad usage (what argparse refuses, a missing HOST, a question nobody can
# answer), 1 for every other error, a malformed or unknown allow-list entry included (the CLI's too)
EXIT_ERROR, EXIT_USAGE = 1, 2


def run(args: argparse.Namespace) -> int:
    """The command's model (the agent tools' shapes), as JSON with ``--json``, else as text; errors
    as one line ``error: ...`` on stderr."""
    try:
        model = _dispatch(_provider(), args)
    except SandboxError as exc:
        hint = (f"; list them with: hermes sandbox checkpoints --sandbox {exc.sandbox}"
                if isinstance(exc, CheckpointNotFound) and exc.sandbox else "")
        error(f"{exc}{hint}")
        return EXIT_USAGE if isinstance(exc, BadUsage) else EXIT_ERROR
    except OSError as exc:  # e.g. an unreadable state directory: the user's to fix, as the CLI says it
        error(f"{exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}")
        return EXIT_ERROR
    ui = Ui()
    if getattr(args, "as_json", False):
        ui.json(model)
    else:
        TEXT[args.sandbox_command](ui, model)
    return 0


def _dispatch(provider: SandboxProvider, args: argparse.Namespace) -> Any:
    command = args.sandbox_command
    if command == "list":
        settings = provider.settings()
        backend = provider.backend(settings)
        return [i.to_dict() for i in backend.list() if naming.within_prefix(settings.name_prefix, i.name)]
    recorded = _recorded(provider, args.sandbox)
    if command == "network":
        return _network(recorded, args.action, args.hosts)
    if command == "checkpoints":
        return tools.checkpoints_result(recorded)
    if command == "diff":
        preview = recorded.restore_preview(args.checkpoint)
        if preview.changes is None:
            raise SandboxError(f"no diff for checkpoint {args.checkpoint}: {preview.diff_unavailable}")
        return tools.diff_result(recorded.name, args.checkpoint, preview)
    if not args.yes:
        if not sys.stdin.isatty():
            raise Unconfirmable("restore throws work away: run it on a terminal to see what and confirm, "
                                "or pass --yes")
        if not _confirm_restore(recorded, args.checkpoint):
            raise RestoreDeclined("restore cancelled; nothing was changed")
    discarded = recorded.restore(args.checkpoint)
    return tools.restore_result(recorded, args.checkpoint, discarded)


def _network(recorded: RecordedSandbox, action: str, hosts: list[str]) -> dict[str, Any]:
    if action in ("allow", "deny") and not hosts:
        raise BadUsage(f"network {action} needs at least one HOST entry")
    if action == "show":
        spec = recorded.inner.info().spec
        return {"sandbox": recorded.name, "network": spec.network, "allow": list(spec.allow)}
    entries = recorded.change_allow(replace=hosts if action == "set" else None,
                                    add=hosts if action == "allow" else (), remove=hosts if action == "deny" else ())
    return {"sandbox": recorded.name, "network": "proxy", "allow": list(entries)}


class RestoreDeclined(SandboxError):
    """The user said no (exit 1)."""


class BadUsage(SandboxError):
    """What hermes-sandboxes refuses as bad usage, before doing anything (exit 2)."""


class Unconfirmable(BadUsage):
    """Nobody can be asked (stdin is not a terminal) and no --yes: bad usage (exit 2)."""


def _confirm_restore(recorded: RecordedSandbox, checkpoint_id: str) -> bool:
    """Show what a restore throws away and ask (stdin is a terminal)."""
    preview = recorded.restore_preview(checkpoint_id)
    commands = preview.commands
    print(f"Restoring {recorded.name} to {checkpoint_id} throws away:", file=sys.stderr)
    if preview.summary is None:
        print(f"  file changes: unknown ({preview.diff_unavailable})", file=sys.stderr)
    else:
        total = preview.summary.total
        print(f"  {total.files} changed path(s): {total.added} added, {total.modified} modified, "
              f"{total.deleted} deleted", file=sys.stderr)
        for row in preview.summary.rows[:10]:
            print(f"    {row.path}: {row.files}", file=sys.stderr)
    if commands is None:
        print("  commands since: unknown (no journal for this checkpoint)", file=sys.stderr)
    else:
        print(f"  {len(commands)} command(s) since it:", file=sys.stderr)
        for record in commands[-10:]:
            print(f"    [exit {record.exit_code}] {record.command[:100]}", file=sys.stderr)
    # the question on stderr too, as hermes-sandboxes asks it: stdout holds only the result (--json's)
    print(f"Restore {recorded.name} to {checkpoint_id}? [y/N] ", end="", file=sys.stderr, flush=True)
    return sys.stdin.readline().strip().lower() in ("y", "yes")


# -- text: the model as hermes-sandboxes shows the same things -------------------------------------


def _list_text(ui: Ui, infos: Sequence[Mapping[str, Any]]) -> None:
    if not infos:
        ui.note("no sandboxes under this install's name_prefix yet; a Hermes session makes one with its "
                "first command")
        return
    rows = [[i["name"], i["state"], "ephemeral" if i["ephemeral"] else "persistent", age(i["created_at"]),
             i["spec"]["network"], human_size(i["layer_bytes"]), str(i["checkpoint_count"])] for i in infos]
    ui.table(["NAME", "STATE", "KIND", "AGE", "NETWORK", "CHANGED", "CHECKPOINTS"], rows)


def _checkpoints_text(ui: Ui, model: Mapping[str, Any]) -> None:
    name, items = model["sandbox"], model["checkpoints"]
    if not items:
        ui.note(f"{name} has no checkpoints yet; take one with /sandbox checkpoint in the chat")
    else:
        rows = [[c["id"], age(c["created_at"]), c["trigger"] if c["journaled"] else "-",
                 one_line(c["comment"]) or "-", _count(c) if c["journaled"] else "-",
                 human_size(c["layer_bytes"]), _health(c["health"])] for c in reversed(items)]
        ui.table(["ID", "AGE", "TRIGGER", "COMMENT", "COMMANDS", "SIZE", "HEALTH"], rows,
                 title=f"checkpoints of {name}, newest first")
    if model.get("retention"):
        ui.note(str(model["retention"]))


def _count(view: Mapping[str, Any]) -> str:
    return str(len(view["commands"]) + int(view.get("earlier_commands_omitted", 0)))


def _health(health: Mapping[str, Any] | None) -> str:
    return "-" if health is None else "passed" if health["passed"] else "FAILED"


def _diff_text(ui: Ui, model: Mapping[str, Any]) -> None:
    since, summary = model["since"], model["summary"]
    if not summary or not summary["total"]["files"]:
        ui.line(f"no changes from {since} to now")
    else:
        summary_table(ui, summary, title=f"changes from {since} to now")
    _commands_text(ui, model["commands"], model.get("earlier_commands_omitted", 0), since=since)


def _commands_text(ui: Ui, commands: Sequence[Mapping[str, Any]], omitted: int, *, since: str) -> None:
    if not commands:
        ui.line(f"no commands since {since}")
        return
    rows = [["-" if c["exit_code"] is None else str(c["exit_code"]), one_line(str(c["command"]), 80)]
            for c in commands]
    earlier = f" (the last {len(commands)}; {omitted} earlier not shown)" if omitted else ""
    ui.table(["EXIT", "COMMAND"], rows, title=f"commands since {since}{earlier}")


def _restore_text(ui: Ui, model: Mapping[str, Any]) -> None:
    discarded, omitted = model["discarded_commands"], int(model.get("earlier_commands_omitted", 0))
    restored = f"restored {model['sandbox']} to {model['restored']}"
    if discarded is None:
        ui.result(f"{restored}; the commands since it are unknown (no journal for this checkpoint)")
    else:
        ui.result(f"{restored}, discarding {len(discarded) + omitted} command(s)" + (":" if discarded else ""))
        if omitted:
            ui.result(f"  … {omitted} earlier")
        for command in discarded:
            ui.result(f"  {one_line(command, 100)}")
    ui.note("processes that were running were stopped; start again any server you need")


def _network_text(ui: Ui, model: Mapping[str, Any]) -> None:
    ui.result(describe_network(model["sandbox"], model["network"], model["allow"]))


TEXT: dict[str, Callable[[Ui, Any], None]] = {
    "list": _list_text, "checkpoints": _checkpoints_text, "diff": _diff_text, "restore": _restore_text,
    "network": _network_text,
}


def register_cli(ctx: Any) -> None:
    ctx.register_cli_command(
        name="sandbox", help="hermes-sandboxes sandboxes: list, checkpoints, diff, restore, network",
        setup_fn=_setup, handler_fn=run,
        description="Inspect and roll back this profile's hermes-sandboxes sandboxes.",
    )
