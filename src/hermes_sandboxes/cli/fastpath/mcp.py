"""``hermes-sandboxes mcp`` without click, rich or pydantic: a client spawns the server and waits
only a few seconds for its ``initialize`` answer, which must not wait for the CLI's own imports
(~0.25 s quiet, a second on a loaded two-core machine).

``try_mcp(argv)`` handles ``[--home DIR] [-b NAME] [--config FILE] [-o K=V]... mcp [--http]
[--port N] [--sandbox NAME] [--prefix P] [--allow-network-changes]``; anything else (``--help``,
an unknown or malformed option) returns None before doing anything and the click command runs
instead, which serves through the same ``serve``. The ``Workspace`` (settings, backend) is built on
the first tool call that needs it, never before ``initialize`` is answered.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # (typing.TYPE_CHECKING without importing typing: this is a start-up path)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeVar

    from hermes_sandboxes.cli.session import Workspace

    T = TypeVar("T")

_GLOBAL = {"--home": "home", "--backend": "backend", "-b": "backend", "--config": "config",
           "--option": "option", "-o": "option"}
_OWN = {"--port": "port", "--sandbox": "pinned", "--prefix": "prefix"}
_FLAGS = {"--http": "use_http", "--allow-network-changes": "allow_network_changes"}


def _split(arg: str, args: list[str], i: int, table: dict[str, str]) -> tuple[str, str, int] | None:
    """(attribute, value, next index) if ``args[i]`` is an option of ``table`` with its value."""
    name, sep, value = arg.partition("=")
    if name not in table:
        return None
    if sep:
        return table[name], value, i + 1
    if i + 1 >= len(args):
        return None
    return table[name], args[i + 1], i + 2


def parse(args: list[str]) -> dict[str, Any] | None:
    """The invocation ``args`` describes, or None when the click CLI should handle them."""
    found: dict[str, Any] = {"options": [], "use_http": False, "allow_network_changes": False, "port": "8765",
                             "prefix": "mcp", "pinned": None, "home": None, "backend": None, "config": None}
    i = 0
    while i < len(args) and args[i] != "mcp":
        got = _split(args[i], args, i, _GLOBAL)
        if got is None:
            return None
        attr, value, i = got
        if attr == "option":
            found["options"].append(value)
        else:
            found[attr] = value
    if i >= len(args):
        return None
    i += 1
    while i < len(args):
        if args[i] in _FLAGS:
            found[_FLAGS[args[i]]] = True
            i += 1
            continue
        got = _split(args[i], args, i, _OWN)
        if got is None:
            return None
        attr, value, i = got
        found[attr] = value
    if not found["port"].isdigit() or int(found["port"]) > 65535:
        return None
    found["port"] = int(found["port"])
    return found


def try_mcp(args: list[str]) -> int | None:
    found = parse(args)
    if found is None:
        return None
    from hermes_sandboxes.errors import SandboxError

    def workspace() -> Workspace:
        from hermes_sandboxes.cli.config import parse_overrides
        from hermes_sandboxes.cli.session import Workspace

        overrides, labels = parse_overrides(found["options"]), {}
        if found["home"] is not None:
            overrides["home"], labels["home"] = found["home"], "--home"
        # (the backend and config file variables are read by the settings loader, as for the click CLI)
        return Workspace(found["backend"], found["config"], overrides, labels)

    try:
        return serve(workspace, use_http=found["use_http"], port=found["port"], pinned=found["pinned"],
                     prefix=found["prefix"], allow_network_changes=found["allow_network_changes"])
    except SandboxError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1


def once(make: Callable[[], T]) -> Callable[[], T]:
    """``make()`` on the first call only, whatever thread asks first (tool calls run in parallel)."""
    import threading

    lock = threading.Lock()
    made: list[T] = []

    def get() -> T:
        with lock:
            if not made:
                made.append(make())
            return made[0]

    return get


def serve(make_workspace: Callable[[], Workspace], *, use_http: bool, port: int, pinned: str | None, prefix: str,
          allow_network_changes: bool) -> int:
    """Run the MCP server over the workspace ``make_workspace()`` gives (made on first use)."""
    from hermes_sandboxes.mcp.scope import Host, Rules
    from hermes_sandboxes.mcp.server import build
    from hermes_sandboxes.names import validate_name

    validate_name(prefix)
    if pinned is not None:
        validate_name(pinned)
    workspace = once(make_workspace)

    def state() -> Any:
        return workspace().state

    host = Host(backend=once(lambda: workspace().backend), state=state,
                settings=once(lambda: workspace().effective.settings), owners=once(lambda: workspace().owners))
    running = build(host, Rules(prefix=prefix, pinned=pinned, allow_network_changes=allow_network_changes))
    if use_http:
        from hermes_sandboxes.mcp.http import serve_http
        from hermes_sandboxes.recorder.state import default_state_dir

        return serve_http(running, port=port, state_dir=default_state_dir())
    from hermes_sandboxes.mcp.stdio import serve_stdio

    return serve_stdio(running)
