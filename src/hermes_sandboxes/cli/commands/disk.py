"""Disk that stays bounded: ``df`` (what the store and each sandbox take), when each sandbox was last
used (``ls``'s LAST USED), and ``gc --unused-for`` (persistent sandboxes nobody used for that long).

A sandbox's last use is the newest record of its journal in this host's state directory (a command,
a checkpoint, a restore, from any face: CLI, API, Hermes), else its creation. It says when this host
last did something with it, which is what "unused for 14 days" asks.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import click

from hermes_sandboxes.cli.session import Workspace
from hermes_sandboxes.errors import InvalidInput, SandboxError
from hermes_sandboxes.sandbox import SandboxInfo
from hermes_sandboxes.ui.output import Ui, age, confirm, human_size
from hermes_sandboxes.util.units import parse_duration


def last_used(workspace: Workspace, info: SandboxInfo) -> float:
    """When this host last recorded something for the sandbox (else when it was created)."""
    try:
        return workspace.journal(info.name).path.stat().st_mtime
    except OSError:
        return info.created_at


@click.command(short_help="Disk use of the store and of each sandbox.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def df(workspace: Workspace, as_json: bool) -> None:
    """What the sandbox store takes on disk, and per sandbox: its writable layer, its checkpoints
    (each counted on its own: on btrfs they share unchanged data), EXCLUSIVE (what removing it
    would give back) and when it was last used."""
    ui = Ui()
    with ui.status("measuring…"):
        usage = workspace.backend.disk_usage()
        infos = {i.name: i for i in workspace.backend.list()}
    used = {name: last_used(workspace, info) for name, info in infos.items()}
    if as_json:
        data = usage.to_dict()
        for entry in data["sandboxes"]:
            entry["last_used"] = used.get(entry["name"])
        ui.json(data)
        return
    host = f", {human_size(usage.host_bytes)} on the host disk" if usage.host_bytes is not None else ""
    ui.note(f"store {usage.path}: {human_size(usage.used_bytes)} in use{host}")
    rows = [[s.name, human_size(s.layer_bytes), f"{human_size(s.checkpoint_bytes)} ({s.checkpoint_count})",
             human_size(s.exclusive_bytes), age(used[s.name]) if s.name in used else "-"]
            for s in sorted(usage.sandboxes, key=lambda s: -s.exclusive_bytes)]
    if rows:
        ui.table(["NAME", "LAYER", "CHECKPOINTS", "EXCLUSIVE", "LAST USED"], rows)


def unused(workspace: Workspace, older_than: float) -> list[SandboxInfo]:
    """Persistent sandboxes last used more than ``older_than`` seconds ago, least recent first."""
    now = time.time()
    found = [(last_used(workspace, i), i) for i in workspace.backend.list() if not i.ephemeral]
    return [i for when, i in sorted(found, key=lambda pair: pair[0]) if now - when > older_than]


def collect_unused(workspace: Workspace, spec: str, yes: bool) -> int:
    """``gc --unused-for SPEC``: list them; remove them only with --yes or a person's yes at a
    terminal (a script without --yes is refused, exit 1)."""
    try:
        older_than = parse_duration(spec)
    except InvalidInput as exc:
        raise click.BadParameter(str(exc), param_hint="'--unused-for'") from None
    ui = Ui()
    stale = unused(workspace, older_than)
    if not stale:
        ui.note(f"no persistent sandbox is unused for more than {spec}")
        return 0
    ui.table(["NAME", "LAST USED", "CHANGED", "CHECKPOINTS"],
             [[i.name, age(last_used(workspace, i)), human_size(i.layer_bytes), str(i.checkpoint_count)]
              for i in stale])
    if not confirm(f"Destroy these {len(stale)} sandbox(es), their files and checkpoints?", yes=yes,
                   refusal=f"not destroying {len(stale)} unused sandbox(es)"):
        ui.note("cancelled; nothing was changed")
        return 1
    return _destroy(workspace, [i.name for i in stale], ui)


def _destroy(workspace: Workspace, names: Sequence[str], ui: Ui) -> int:
    failed = 0
    for name in names:
        try:
            session = workspace.session(workspace.sandbox(name))
            session.destroy()
            session.close()
            ui.note(f"destroyed {name}")
        except SandboxError as exc:
            failed += 1
            ui.note(f"could not destroy {name}: {exc}")
    return 1 if failed else 0
