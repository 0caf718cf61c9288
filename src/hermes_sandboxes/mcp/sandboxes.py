"""The sandbox tools: create, list, info, stop, remove; and the network tools: show the allow-list
and, only when the server was started with ``--allow-network-changes``, change it.

Creating a sandbox takes the spec the backend's settings give (network, limits); the model may ask
for a smaller memory or process limit but not for more network: a sandbox's network, like its
allow-list, is the user's choice unless the server was started to let the model make it.
Removing a sandbox destroys its files and every checkpoint: like a restore, it wants
``confirm: true`` and otherwise says what would be lost.
"""

from __future__ import annotations

from hermes_sandboxes.mcp.commands import SANDBOX_ARG
from hermes_sandboxes.mcp.scope import Scope
from hermes_sandboxes.mcp.tools import READ_ONLY, Annotations, CallContext, Tool, ToolError, ToolResult

TYPE_CHECKING = False  # (typing.TYPE_CHECKING without importing typing: the server's start-up is measured)
if TYPE_CHECKING:
    from typing import Any


class Sandboxes:
    def __init__(self, scope: Scope) -> None:
        self.scope = scope

    def tools(self) -> list[Tool]:
        tools = [
            Tool("sandbox_create", "Create a sandbox", CREATE_DESCRIPTION, self._create_schema(),
                 Annotations(), self.create),
            Tool("sandbox_list", "List sandboxes", LIST_DESCRIPTION, {"type": "object", "properties": {},
                                                                      "additionalProperties": False},
                 READ_ONLY, self.list),
            Tool("sandbox_info", "Describe a sandbox", INFO_DESCRIPTION, SANDBOX_SCHEMA, READ_ONLY, self.info),
            Tool("sandbox_stop", "Stop a sandbox's processes", STOP_DESCRIPTION, SANDBOX_SCHEMA,
                 Annotations(destructive=True, idempotent=True), self.stop),
            Tool("sandbox_remove", "Destroy a sandbox", REMOVE_DESCRIPTION, REMOVE_SCHEMA,
                 Annotations(destructive=True, idempotent=True), self.remove),
            Tool("network_show", "Show a sandbox's network", NETWORK_DESCRIPTION, SANDBOX_SCHEMA, READ_ONLY,
                 self.network),
        ]
        if self.scope.rules.allow_network_changes:
            tools.append(Tool("network_allow", "Change a sandbox's allow-list", ALLOW_DESCRIPTION, ALLOW_SCHEMA,
                              Annotations(open_world=True, idempotent=True), self.allow))
        return tools

    def _create_schema(self) -> dict[str, Any]:
        properties: dict[str, Any] = {
            "name": {"type": "string", "description": "lowercase letters, digits and hyphens, e.g. 'webapp' "
                                                      "(required unless ephemeral)"},
            "ephemeral": {"type": "boolean", "description": "destroyed when this session ends (default false)"},
            "memory_mb": {"type": "integer", "minimum": 16, "description": "memory limit in MiB"},
            "pids": {"type": "integer", "minimum": 1, "description": "most processes at once"},
        }
        if self.scope.rules.allow_network_changes:
            properties["network"] = {"type": "string", "enum": ["none", "loopback", "host", "proxy"],
                                     "description": "none, loopback, host, or proxy (only the hosts in allow)"}
            properties["allow"] = {"type": "array", "items": {"type": "string"},
                                   "description": "with network proxy: hosts it may reach"}
        return {"type": "object", "properties": properties, "additionalProperties": False}

    def create(self, ctx: CallContext, args: dict[str, Any]) -> ToolResult:
        from hermes_sandboxes.sandbox import Limits

        ephemeral = bool(args.get("ephemeral"))
        name = args.get("name")
        if not name and not ephemeral:
            raise ToolError("give a name, or ephemeral true for a throw-away sandbox of this session")
        changes: dict[str, Any] = {}
        base = self.scope.spec()
        if args.get("memory_mb") is not None or args.get("pids") is not None:
            limits = base.limits
            memory = args.get("memory_mb")
            changes["limits"] = Limits(memory * 2**20 if memory is not None else limits.memory_bytes,
                                       args.get("pids") or limits.pids, limits.cpus, limits.disk_bytes)
        if args.get("network") is not None:
            changes["network"] = args["network"]
        if args.get("allow") is not None:
            changes["allow"] = tuple(args["allow"])
        opened = self.scope.create(name, self.scope.spec(**changes), ephemeral=ephemeral, session=ctx.session_id)
        info = opened.recorded.inner.info()
        kind = "ephemeral (destroyed when this session ends)" if ephemeral else "persistent"
        return ToolResult.ok({"sandbox": info.name, "info": _info(info),
                              "message": f"Created {kind} sandbox {info.name}; run commands in it with exec "
                                         f"(sandbox {info.name!r}). Its home is {opened.recorded.inner.home}."})

    def list(self, ctx: CallContext, args: dict[str, Any]) -> ToolResult:
        infos = self.scope.sandboxes()
        items = [{"name": i.name, "state": str(i.state), "ephemeral": i.ephemeral, "network": i.spec.network,
                  "checkpoints": i.checkpoint_count, "created_at": round(i.created_at, 3)} for i in infos]
        message = (f"{len(items)} sandbox(es) ({self.scope.describe()})." if items
                   else f"No sandboxes yet ({self.scope.describe()}); sandbox_create makes one.")
        return ToolResult.ok({"sandboxes": items, "message": message})

    def info(self, ctx: CallContext, args: dict[str, Any]) -> ToolResult:
        from hermes_sandboxes.sandbox import Capability

        opened = self.scope.use(args.get("sandbox"))
        sandbox = opened.recorded.inner
        backend = sandbox.backend
        has = {str(c) for c in backend.capabilities}
        data = {"sandbox": sandbox.name, "info": _info(sandbox.info()), "home": sandbox.home,
                "backend": backend.name, "capabilities": sorted(has),
                "missing_capabilities": sorted(str(c) for c in Capability if str(c) not in has),
                "checkpoint_policy": opened.recorded.policy,
                "owned_by_this_session": self.scope.owner_of(sandbox.name) == ctx.session_id}
        return ToolResult.ok(data)

    def stop(self, ctx: CallContext, args: dict[str, Any]) -> ToolResult:
        opened = self.scope.use(args.get("sandbox"))
        opened.recorded.inner.stop()
        name = opened.recorded.name
        return ToolResult.ok({"sandbox": name, "stopped": True,
                              "message": f"Stopped every process in {name}; its files stay and the next command "
                                         "starts it again."})

    def remove(self, ctx: CallContext, args: dict[str, Any]) -> ToolResult:
        opened = self.scope.use(args.get("sandbox"))
        name = opened.recorded.name
        if args.get("confirm") is not True:
            count = len(opened.recorded.inner.checkpoints())
            return ToolResult.ok({"sandbox": name, "removed": False, "checkpoints": count,
                                  "message": f"Nothing was changed. Removing {name} destroys its files, its processes "
                                             f"and its {count} checkpoint(s), for good. To do it, call sandbox_remove "
                                             "again with confirm true."})
        self.scope.remove(name)
        return ToolResult.ok({"sandbox": name, "removed": True, "message": f"Destroyed sandbox {name}."})

    def network(self, ctx: CallContext, args: dict[str, Any]) -> ToolResult:
        opened = self.scope.use(args.get("sandbox"))
        spec = opened.recorded.inner.info().spec
        changes = ("network_allow changes it" if self.scope.rules.allow_network_changes
                   else "only the user can change it (hermes-sandboxes network allow/deny)")
        return ToolResult.ok({"sandbox": opened.recorded.name, "network": spec.network, "allow": list(spec.allow),
                              "message": f"network {spec.network}" + (f", allowed: {', '.join(spec.allow)}"
                                                                      if spec.network == "proxy" else "")
                                         + f"; {changes}."})

    def allow(self, ctx: CallContext, args: dict[str, Any]) -> ToolResult:
        opened = self.scope.use(args.get("sandbox"))
        entries = opened.recorded.change_allow(replace=args.get("replace"), add=args.get("add") or (),
                                               remove=args.get("remove") or ())
        return ToolResult.ok({"sandbox": opened.recorded.name, "allow": list(entries),
                              "message": "allow-list now: " + (", ".join(entries) or "(empty)")})


def _info(info: Any) -> dict[str, Any]:
    data: dict[str, Any] = info.to_dict()
    data["created_at"] = round(info.created_at, 3)
    return data


SANDBOX_SCHEMA: dict[str, Any] = {"type": "object", "properties": {"sandbox": SANDBOX_ARG},
                                  "additionalProperties": False}
CREATE_DESCRIPTION = (
    "Create a sandbox: an isolated machine with its own files and processes, where exec runs commands. "
    "Persistent sandboxes (by name) stay until removed; an ephemeral one is destroyed when this session ends. "
    "Every risky command in it gets an automatic checkpoint that checkpoint_restore can roll back to.")
LIST_DESCRIPTION = "List the sandboxes this server can use, with their state and checkpoint count."
INFO_DESCRIPTION = ("Describe a sandbox: its state, network, limits, home directory, and what its backend can do "
                    "(checkpoints, diff, fork, tree kill) or cannot.")
STOP_DESCRIPTION = "Stop every process in a sandbox (servers, background jobs). Its files stay."
REMOVE_DESCRIPTION = ("Destroy a sandbox with its files and all its checkpoints, for good. Without confirm it changes "
                      "nothing and says what would be lost.")
REMOVE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"sandbox": SANDBOX_ARG,
                   "confirm": {"type": "boolean", "description": "true to destroy; false or absent: only say what "
                                                                 "would be lost"}},
    "additionalProperties": False,
}
NETWORK_DESCRIPTION = "Show a sandbox's network mode and egress allow-list (the hosts it may reach)."
ALLOW_DESCRIPTION = ("Change the hosts a sandbox with network proxy may reach: replace the list, or add and remove "
                     "entries (hosts, *.wildcards, IPs, host:port).")
ALLOW_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"sandbox": SANDBOX_ARG,
                   "replace": {"type": "array", "items": {"type": "string"}},
                   "add": {"type": "array", "items": {"type": "string"}},
                   "remove": {"type": "array", "items": {"type": "string"}}},
    "additionalProperties": False,
}
