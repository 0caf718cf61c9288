"""``network``: a sandbox's network mode and its egress allow-list, shown and changed in place.

``allow``, ``deny`` and ``set`` replace the list of a sandbox with network ``proxy`` through the
contract (``Sandbox.set_allow``), running or not: the proxy applies the new list to the next
connection, without a restart, and the change goes to the sandbox's journal and the audit log
(``log`` shows it). A backend without ``Capability.EGRESS_ALLOWLIST`` refuses in one line.

Each change reads, edits and writes the list under the sandbox's allow-list lock
(``RecordedSandbox.allow_lock``, also taken by ``hermes sandbox network`` and the Python API), so
changes made at once on this host all land, one after the other.
"""

from __future__ import annotations

from collections.abc import Sequence

import click

from hermes_sandboxes.cli.session import Workspace
from hermes_sandboxes.ui.output import Ui, describe_network


@click.group(short_help="A sandbox's network mode and egress allow-list.")
def network() -> None:
    """Show or change what a sandbox's network reaches. Entries are host names, *.domains,
    addresses or networks, each with an optional :PORT (:* any port; none means 80 and 443), and
    the presets @pypi, @npm, @debian, @github. Changes apply to new connections at once."""


def _show(ui: Ui, name: str, mode: str, allow: Sequence[str], as_json: bool) -> None:
    if as_json:
        ui.json({"name": name, "network": mode, "allow": list(allow)})
        return
    ui.result(describe_network(name, mode, allow))


@network.command(short_help="The network mode and allow-list of a sandbox.")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def show(workspace: Workspace, name: str, as_json: bool) -> None:
    """NAME's network mode and, with network proxy, the hosts it may reach."""
    spec = workspace.sandbox(name).info().spec
    _show(Ui(), name, spec.network, spec.allow, as_json)


def _change(workspace: Workspace, name: str, replace: Sequence[str] | None, *, add: Sequence[str] = (),
            remove: Sequence[str] = (), as_json: bool) -> None:
    """Replace NAME's list with ``replace``, or the current one with ``add`` and without ``remove``."""
    session = workspace.session(workspace.sandbox(name))
    try:
        entries = session.recorded.change_allow(replace=replace, add=add, remove=remove)
    finally:
        session.close()
    _show(Ui(), name, "proxy", entries, as_json)


_JSON = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


def checked_hosts(_ctx: click.Context, param: click.Parameter, hosts: tuple[str, ...]) -> tuple[str, ...]:
    """``hosts`` if each is an allow-list entry, else bad usage (exit 2) naming the entry and the
    argument or flag it came from: a typo on the command line is the caller's to fix, not an error
    of the sandbox."""
    from hermes_sandboxes import allowlist
    from hermes_sandboxes.errors import InvalidInput

    try:
        return allowlist.validate(hosts)
    except InvalidInput as exc:
        raise click.BadParameter(str(exc), param=param) from None


@network.command(short_help="Let a sandbox reach more hosts.")
@click.argument("name")
@click.argument("hosts", nargs=-1, required=True, metavar="HOST...", callback=checked_hosts)
@_JSON
@click.pass_obj
def allow(workspace: Workspace, name: str, hosts: tuple[str, ...], as_json: bool) -> None:
    """Add HOST entries to NAME's allow-list (entries it holds already are kept once)."""
    _change(workspace, name, None, add=hosts, as_json=as_json)


@network.command(short_help="Take hosts off a sandbox's allow-list.")
@click.argument("name")
@click.argument("hosts", nargs=-1, required=True, metavar="HOST...")
@_JSON
@click.pass_obj
def deny(workspace: Workspace, name: str, hosts: tuple[str, ...], as_json: bool) -> None:
    """Remove HOST entries, as written in the list (see network show), from NAME's allow-list.
    Connections already open keep going; new ones are refused."""
    _change(workspace, name, None, remove=hosts, as_json=as_json)


@network.command(name="set", short_help="Replace a sandbox's allow-list.")
@click.argument("name")
@click.argument("hosts", nargs=-1, metavar="[HOST...]", callback=checked_hosts)
@_JSON
@click.pass_obj
def set_(workspace: Workspace, name: str, hosts: tuple[str, ...], as_json: bool) -> None:
    """Replace NAME's allow-list with HOST entries; none leaves it reaching nothing."""
    _change(workspace, name, list(hosts), as_json=as_json)
