"""The MCP server of hermes-sandboxes: its tools over one scope of sandboxes, on a transport.

``build()`` assembles the catalog (sandboxes, exec, files, checkpoints, network) over a ``Scope``
and returns the protocol ``Server``; ``serve_stdio`` and ``serve_http`` run it. Nothing here imports
a backend: the scope builds one on the first tool call that needs it.
"""

from __future__ import annotations

import sys
import threading

from hermes_sandboxes import __version__
from hermes_sandboxes.mcp.commands import RESTORE_TOOL, Commands
from hermes_sandboxes.mcp.files import Files
from hermes_sandboxes.mcp.output import Spools
from hermes_sandboxes.mcp.protocol import Server, Session
from hermes_sandboxes.mcp.sandboxes import Sandboxes
from hermes_sandboxes.mcp.scope import Host, Rules, Scope
from hermes_sandboxes.mcp.story import Story
from hermes_sandboxes.mcp.tools import Catalog
from hermes_sandboxes.util.values import dataclass, field

SERVER_NAME = "hermes-sandboxes"


def instructions(scope: Scope) -> str:
    """What the client puts in front of the model about this server."""
    pinned = scope.rules.pinned
    where = (f"Use sandbox {pinned} (it is the only one; the 'sandbox' argument may be left out)." if pinned
             else "Create one with sandbox_create (or reuse one from sandbox_list) and pass its name as 'sandbox'.")
    return (
        "These tools run commands in sandboxes: isolated machines with their own files, not the user's computer. "
        f"Run every shell command with exec instead of a local shell. {where} Before a risky command (rm -rf, "
        "git reset --hard, overwriting files) a checkpoint is taken automatically; the exec result names it and "
        f"the {RESTORE_TOOL} call that undoes the command. Save your own with checkpoint_create before work you "
        f"may want to undo. {RESTORE_TOOL} and sandbox_remove only preview unless called with confirm true.")


@dataclass()
class Running:
    """A built server and what it owns (the scope's sandboxes, the spooled outputs)."""

    server: Server
    scope: Scope
    spools: Spools
    sessions: list[Session] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def open_session(self, send: object, session_id: str | None = None) -> Session:
        session = self.server.session(send, session_id=session_id)  # type: ignore[arg-type]
        with self.lock:
            self.sessions.append(session)
        return session

    def close(self) -> None:
        """End every session (their commands are killed, their ephemeral sandboxes destroyed)."""
        with self.lock:
            sessions, self.sessions = list(self.sessions), []
        for session in sessions:
            session.close()
        self.scope.close()
        self.spools.close()


def build(host: Host, rules: Rules) -> Running:
    scope = Scope(host, rules)
    spools = Spools()
    catalog = Catalog([*Sandboxes(scope).tools(), *Commands(scope, spools).tools(), *Files(scope).tools(),
                       *Story(scope).tools()])

    def session_ended(session: Session) -> None:
        try:
            ended = scope.end_session(session.id)
        except Exception as exc:  # never let cleanup take the server down; gc collects what is left
            print(f"hermes-sandboxes mcp: cleaning up session {session.id} failed: {exc}", file=sys.stderr)
            return
        if ended:
            print(f"hermes-sandboxes mcp: destroyed ephemeral sandbox(es) {', '.join(ended)}", file=sys.stderr)

    server = Server(catalog, name=SERVER_NAME, version=__version__, instructions=instructions(scope),
                    on_session_end=session_ended)
    return Running(server, scope, spools)
