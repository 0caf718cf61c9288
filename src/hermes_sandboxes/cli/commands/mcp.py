"""``hermes-sandboxes mcp``: the sandboxes as an MCP server, for any agent (see docs/mcp.md).

The CLI's global options choose the backend and its settings as for every other command
(``--backend``, ``--config``, ``-o``); the server reaches them through the same ``Workspace``, built
on the first tool call, so the client's ``initialize`` is answered before any backend is imported.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import click

from hermes_sandboxes.cli.session import Workspace

T = TypeVar("T")


def _once(make: Callable[[], T]) -> Callable[[], T]:
    """``make()`` on the first call only, whatever thread asks first (tool calls run in parallel)."""
    lock = threading.Lock()
    made: list[T] = []

    def get() -> T:
        with lock:
            if not made:
                made.append(make())
            return made[0]

    return get


@click.command(name="mcp", short_help="Serve the sandboxes to any agent over MCP.")
@click.option("--http", "use_http", is_flag=True,
              help="Serve streamable HTTP on 127.0.0.1 instead of stdio (bearer token from the token file).")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True,
              help="With --http: the port on 127.0.0.1 (0: any free one, said on stderr).")
@click.option("--sandbox", "pinned", metavar="NAME", help="Serve only this sandbox (created on first use).")
@click.option("--prefix", default="mcp", show_default=True, metavar="PREFIX",
              help="The server's sandboxes are PREFIX-*; it refuses to touch any other.")
@click.option("--allow-network-changes", is_flag=True,
              help="Let the model choose a new sandbox's network and change allow-lists (off by default).")
@click.pass_obj
def mcp(workspace: Workspace, use_http: bool, port: int, pinned: str | None, prefix: str,
        allow_network_changes: bool) -> int:
    """Serve the sandboxes over the Model Context Protocol: exec, files, checkpoints and restore as
    tools for Claude Code, Codex CLI, Gemini CLI, opencode, Cursor or VS Code.

    \b
    Claude Code:  claude mcp add sandbox -- hermes-sandboxes mcp
    Codex:        [mcp_servers.sandbox] command = "hermes-sandboxes", args = ["mcp"]
    """
    from hermes_sandboxes.mcp.scope import Host, Rules
    from hermes_sandboxes.mcp.server import build
    from hermes_sandboxes.names import validate_name

    validate_name(prefix)
    if pinned is not None:
        validate_name(pinned)
    workspace.on_collect = None  # stdout is the protocol's; collection is said on stderr by gc itself
    host = Host(backend=_once(lambda: workspace.backend), state=lambda: workspace.state,
                settings=_once(lambda: workspace.effective.settings), owners=_once(lambda: workspace.owners))
    running = build(host, Rules(prefix=prefix, pinned=pinned, allow_network_changes=allow_network_changes))
    if use_http:
        from hermes_sandboxes.mcp.http import serve_http

        return serve_http(running, port=port, state_dir=workspace.state.root)
    from hermes_sandboxes.mcp.stdio import serve_stdio

    return serve_stdio(running)
