"""``hermes sandbox ...``: the user's view of this profile's sandboxes from inside Hermes.

It acts on the active terminal backend when that is one of ours (else on the first of our providers
this Hermes loaded). ``list`` shows the sandboxes under the install's ``name_prefix``;
``checkpoints``, ``diff`` and ``restore`` act on one of them, by default the profile's default sandbox
(the one the CLI and cron use). ``network`` shows or changes a sandbox's egress allow-list (network
``proxy``) in place, for its next connection, and the change is recorded; a change made here is
kept when the plugin resumes the sandbox with another ``allow`` setting (see hermes/allowlist.py). A name
outside the prefix is refused, like everywhere else in the plugin.

Output: JSON on stdout in the shapes the agent tools answer with (tools.py: ``checkpoints``,
``diff`` and ``restore`` give the same fields, ``discarded_commands`` a list), errors one line
``error: ...`` on stderr; exit 1 for an error, 2 for bad usage (a restore without --yes where nobody
can confirm), as hermes-sandboxes does.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from hermes_sandboxes.errors import CheckpointNotFound, InvalidInput, SandboxError
from hermes_sandboxes.hermes import naming, tools
from hermes_sandboxes.hermes.providers.registry import active, registered
from hermes_sandboxes.recorder.credentials import Redactor
from hermes_sandboxes.recorder.sandbox import RecordedSandbox

if TYPE_CHECKING:
    from hermes_sandboxes.hermes.providers.base import SandboxProvider


def _setup(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="sandbox_command", required=True)
    sub.add_parser("list", help="sandboxes under this install's name_prefix")
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
    p = sub.add_parser("network", help="show or change a sandbox's egress allow-list (network proxy)")
    p.add_argument("action", choices=("show", "allow", "deny", "set"),
                   help="show it; allow or deny entries; set: replace the list")
    p.add_argument("hosts", nargs="*", metavar="HOST", help="allow-list entries (pypi.org, *.example.com, "
                                                            "127.0.0.1:8080, @pypi)")
    p.add_argument("--sandbox", help="sandbox name (default: this profile's default sandbox)")


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


EXIT_ERROR, EXIT_USAGE = 1, 2  # as hermes-sandboxes: 2 for bad usage or a question nobody can answer


def run(args: argparse.Namespace) -> int:
    """JSON on stdout in the agent tools' shapes (one output model for both); errors as one line
    ``error: ...`` on stderr."""
    try:
        print(json.dumps(_dispatch(_provider(), args), indent=2, default=str))
        return 0
    except SandboxError as exc:
        hint = (f"; list them with: hermes sandbox checkpoints --sandbox {exc.sandbox}"
                if isinstance(exc, CheckpointNotFound) and exc.sandbox else "")
        print(f"error: {exc}{hint}", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, InvalidInput | Unconfirmable) else EXIT_ERROR


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
        raise InvalidInput(f"network {action} needs at least one HOST entry")
    if action == "show":
        spec = recorded.inner.info().spec
        return {"sandbox": recorded.name, "network": spec.network, "allow": list(spec.allow)}
    entries = recorded.change_allow(replace=hosts if action == "set" else None,
                                    add=hosts if action == "allow" else (), remove=hosts if action == "deny" else ())
    return {"sandbox": recorded.name, "network": "proxy", "allow": list(entries)}


class RestoreDeclined(SandboxError):
    """The user said no (exit 1)."""


class Unconfirmable(SandboxError):
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
    answer = input(f"Restore {recorded.name} to {checkpoint_id}? [y/N] ")
    return answer.strip().lower() in ("y", "yes")


def register_cli(ctx: Any) -> None:
    ctx.register_cli_command(
        name="sandbox", help="hermes-sandboxes sandboxes: list, checkpoints, diff, restore, network",
        setup_fn=_setup, handler_fn=run,
        description="Inspect and roll back this profile's hermes-sandboxes sandboxes.",
    )
