"""``store info|base|migrate|reclaim|unmount``: looking after the backend's store on this machine.

Only backends that keep one (the local backend) support these; the others say so in one line.
The chosen backend's orphan collection is skipped here: a migration refuses every other use of
the store, and an unmount should not start by opening sandboxes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from hermes_sandboxes.cli.session import Workspace
from hermes_sandboxes.errors import Unsupported
from hermes_sandboxes.ui.output import Ui, human_size

if TYPE_CHECKING:
    from hermes_sandboxes.backends.local.backend import LocalBackend


@click.group(short_help="Show, migrate, reclaim or unmount the sandbox store; build the rootless base.")
def store() -> None:
    """The store where the local backend keeps sandboxes: say which kind it is, build the rootless
    base, migrate a full-copy store to btrfs, give deleted sandboxes' space back to the host disk,
    unmount it."""


def _local(workspace: Workspace) -> LocalBackend:
    from hermes_sandboxes.backends.local.backend import LocalBackend  # not at start-up: every command pays for it

    backend = workspace.backend
    if not isinstance(backend, LocalBackend):
        raise Unsupported(f"the {backend.name} backend keeps no store on this machine")
    return backend


@store.command(short_help="Which store this is and what it can do.")
@click.pass_obj
def info(workspace: Workspace) -> None:
    """The store's kind (btrfs image or full copies as root; subvolume, reflink or overlay rootless,
    after the filesystem of its home), where it is, what a checkpoint costs there, whether disk
    limits are enforced, and (rootless) the base sandboxes are built on."""
    workspace.collect_orphans = False
    ui = Ui()
    lines = _local(workspace).store_info()
    ui.table(["", ""], [[label, value] for label, value in lines], title="store")


@store.command(short_help="Build the rootless base (once; cached).")
@click.pass_obj
def base(workspace: Workspace) -> None:
    """Build the Debian root rootless sandboxes share (mmdebstrap --mode=unshare, about a minute,
    with its progress), or say where the cached one is. Needs mmdebstrap and uidmap."""
    workspace.collect_orphans = False
    ui = Ui()
    root = _local(workspace).build_base(ui.note)
    ui.result(str(root))


@store.command(short_help="Move a full-copy store's sandboxes to btrfs.")
@click.option("--stop", "stop_running", is_flag=True, help="Stop running sandboxes first (else: refuse).")
@click.pass_obj
def migrate(workspace: Workspace, stop_running: bool) -> None:
    """Move every sandbox of a full-copy store (made before btrfs-progs was installed) into a btrfs
    store, with its checkpoints; records, journals and audit logs stay. One sandbox at a time, each
    all or nothing; interrupted, run it again to finish. Refuses while sandboxes run, unless --stop."""
    ui = Ui()
    workspace.collect_orphans = False
    # Ctrl-C is safe at any moment: each sandbox is published by one rename, and the next run finishes
    moved = workspace.backend.migrate_store(stop_running=stop_running, progress=ui.note)
    if moved:
        ui.note(f"migrated {len(moved)} sandbox(es) to the btrfs store")
    else:
        ui.note("the store uses btrfs already: nothing to migrate")


@store.command(short_help="Give deleted sandboxes' space back to the host disk.")
@click.pass_obj
def reclaim(workspace: Workspace) -> None:
    """Give the disk space of deleted sandboxes and checkpoints back to the host now (the kernel
    also does it by itself, later). Prints the bytes given back."""
    ui = Ui()
    workspace.collect_orphans = False
    with ui.status("reclaiming…"):
        freed = workspace.backend.reclaim_store()
    ui.result(str(freed))
    ui.note(f"gave {human_size(freed)} back to the host disk")


@store.command(short_help="Unmount the store (no sandbox may run).")
@click.pass_obj
def unmount(workspace: Workspace) -> None:
    """Unmount the store's btrfs image and free its loop device; refuses while a sandbox runs. The
    next command that needs the store mounts it again."""
    workspace.collect_orphans = False
    if workspace.backend.unmount_store():
        Ui().note("unmounted the store; the next command mounts it again")
    else:
        Ui().note("the store was not mounted")
