"""``hermes sandbox ...``: the user's view of this profile's sandboxes from inside Hermes.

``list`` shows the sandboxes under this install's ``name_prefix``; ``checkpoints``, ``diff`` and
``restore`` act on one of them, by default the profile's default sandbox (the one the CLI and cron
use). A name outside the prefix is refused, like everywhere else in the plugin.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from hermes_sandboxes.errors import SandboxError
from hermes_sandboxes.journal import Journal, audit_path, journal_path
from hermes_sandboxes.recorder import RecordedSandbox

from . import naming

if TYPE_CHECKING:
    from .provider import LocalSandboxProvider


def _setup(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="sandbox_command", required=True)
    sub.add_parser("list", help="sandboxes under this install's name_prefix")
    for command, help_text in (("checkpoints", "checkpoints with their story"),
                               ("diff", "files changed since a checkpoint"),
                               ("restore", "roll a sandbox back to a checkpoint")):
        p = sub.add_parser(command, help=help_text)
        if command != "checkpoints":
            p.add_argument("checkpoint", help="checkpoint id")
        p.add_argument("--sandbox", help="sandbox name (default: this profile's default sandbox)")


def _recorded(provider: LocalSandboxProvider, name: str | None) -> RecordedSandbox:
    settings = provider.settings()
    backend = provider.backend(settings)
    prefix = settings.name_prefix
    if name is None:
        key = naming.task_key_for_scope("default", settings.scope)
        name = naming.persistent_name(prefix, naming.resolve_profile(), key)
    sandbox = backend.get(naming.require_within_prefix(prefix, name))
    home = getattr(backend, "home", settings.store_home())
    return RecordedSandbox(sandbox, Journal(journal_path(home, name)), Journal(audit_path(home)))


def run(provider: LocalSandboxProvider, args: argparse.Namespace) -> int:
    try:
        print(json.dumps(_dispatch(provider, args), indent=2, default=str))
        return 0
    except SandboxError as exc:
        print(f"hermes sandbox: {exc}")
        return 1


def _dispatch(provider: LocalSandboxProvider, args: argparse.Namespace) -> Any:
    command = args.sandbox_command
    if command == "list":
        settings = provider.settings()
        backend = provider.backend(settings)
        return [i.to_dict() for i in backend.list() if naming.within_prefix(settings.name_prefix, i.name)]
    recorded = _recorded(provider, args.sandbox)
    if command == "checkpoints":
        return [cp.to_dict() for cp in recorded.checkpoints()]
    if command == "diff":
        return recorded.restore_preview(args.checkpoint).to_dict()
    discarded = recorded.restore(args.checkpoint)
    return {"restored": args.checkpoint, "sandbox": recorded.name,
            "discarded_commands": None if discarded is None else len(discarded)}


def register_cli(ctx: Any, provider: LocalSandboxProvider) -> None:
    ctx.register_cli_command(
        name="sandbox", help="local sandboxes: list, checkpoints, diff, restore",
        setup_fn=_setup, handler_fn=lambda args: run(provider, args),
        description="Inspect and roll back this profile's hermes-sandboxes sandboxes.",
    )
