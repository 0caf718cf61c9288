"""``hermes-sandboxes mcp``: the sandboxes as an MCP server, for any agent (see docs/mcp.md).

The CLI's global options choose the backend and its settings as for every other command
(``--backend``, ``--config``, ``-o``); the server reaches them through the same ``Workspace``, built
on the first tool call. A plain invocation never gets here: ``cli.fastpath.mcp`` serves it without
importing click (the client waits for ``initialize``); this command is the path for the rest
(``--help``, options it does not parse) and serves through the same ``serve``.
"""

from __future__ import annotations

import click

from hermes_sandboxes.cli.session import Workspace


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
    tools for Claude Code, Codex CLI, Gemini CLI, opencode, Cursor or VS Code (docs/mcp.md).

    \b
    Claude Code:  claude mcp add sandbox -- hermes-sandboxes mcp
    Codex:        [mcp_servers.sandbox] command = "hermes-sandboxes", args = ["mcp"]
    """
    from hermes_sandboxes.cli.fastpath.mcp import serve

    workspace.on_collect = None  # stdout is the protocol's
    return serve(lambda: workspace, use_http=use_http, port=port, pinned=pinned, prefix=prefix,
                 allow_network_changes=allow_network_changes)
