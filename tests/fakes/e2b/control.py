"""The control-plane REST API of the fake E2B (what ``api.e2b.app`` answers), as e2b 2.63 calls it.

- ``POST /v2/sandboxes`` ``{templateID, timeout, autoPause, autoPauseMemory, autoResume, metadata,
  envVars, allow_internet_access, ...}`` -> 201 ``{sandboxID, templateID, clientID, envdVersion,
  envdAccessToken, domain}``. ``templateID`` may name a snapshot: the sandbox starts from it.
- ``POST /v2/sandboxes/{id}/connect`` ``{timeout}`` -> 201 when it resumed a paused sandbox, 200 when
  it was running (the lease is only ever extended: ``max(end, now + timeout)``).
- ``GET /v2/sandboxes?metadata=<urlencoded k=v&..>&state=running,paused&limit=&nextToken=`` -> a
  page of listed sandboxes; ``x-next-token`` names the next page.
- ``GET /sandboxes/{id}``, ``DELETE /sandboxes/{id}`` (204), ``POST /sandboxes/{id}/pause`` (204,
  409 when already paused), ``POST /sandboxes/{id}/timeout`` (sets the lease, shorter or longer).
- ``PUT /sandboxes/{id}/network`` ``{allowOut, denyOut, ...}`` (204): replaces the egress rules of a
  running sandbox (409 when paused). Create takes the same rules under ``network``; both are
  checked as the API documents them (400) and kept (``GET /sandboxes/{id}`` shows them). Rules that
  deny everything but a list are enforced: the sandbox is a local "proxy" sandbox allowed those
  destinations (see world.local_spec); other sandboxes of the fake have no network at all.
- ``POST /sandboxes/{id}/snapshots`` ``{name?}`` -> 201 ``{snapshotID, names}``;
  ``GET /snapshots?sandboxID=&name=&limit=&nextToken=``; ``DELETE /templates/{snapshotID}`` (204).
Errors are ``{"code": n, "message": ...}`` with the HTTP status ``n``.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl, unquote

from tests.fakes.e2b.envd import Receive, Scope, Send, read_body, respond, respond_json
from tests.fakes.e2b.world import FakeSandbox, InvalidRules, Recorded, World, egress_rules, local_allow

Handler = Callable[..., Awaitable[None]]


class DropResponse(Exception):
    """Raised after the response head went out: the server then cuts the connection (a lost reply)."""


class ControlPlane:
    def __init__(self, world: World) -> None:
        self.world = world
        self.routes: list[tuple[str, re.Pattern[str], Handler]] = [
            ("POST", re.compile(r"/v2/sandboxes"), self.create),
            ("GET", re.compile(r"/v2/sandboxes"), self.list),
            ("POST", re.compile(r"/v2/sandboxes/(?P<sid>[^/]+)/connect"), self.connect),
            ("GET", re.compile(r"/sandboxes/(?P<sid>[^/]+)"), self.info),
            ("DELETE", re.compile(r"/sandboxes/(?P<sid>[^/]+)"), self.delete),
            ("POST", re.compile(r"/sandboxes/(?P<sid>[^/]+)/pause"), self.pause),
            ("POST", re.compile(r"/sandboxes/(?P<sid>[^/]+)/timeout"), self.set_timeout),
            ("PUT", re.compile(r"/sandboxes/(?P<sid>[^/]+)/network"), self.update_network),
            ("POST", re.compile(r"/sandboxes/(?P<sid>[^/]+)/snapshots"), self.create_snapshot),
            ("GET", re.compile(r"/snapshots"), self.list_snapshots),
            ("DELETE", re.compile(r"/templates/(?P<tid>.+)"), self.delete_snapshot),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send, record: Recorded) -> None:
        method, path = scope["method"], scope["path"]
        for route_method, pattern, handler in self.routes:
            match = pattern.fullmatch(path)
            if match and route_method == method:
                raw = await read_body(receive)
                body = json.loads(raw) if raw else None
                record.body = body
                record.sandbox_id = match.groupdict().get("sid")
                await handler(send, record, body, **match.groupdict())
                return
        await respond_json(send, 404, {"code": 404, "message": f"no route {method} {path}"})

    async def blocking(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.world.executor, fn, *args)

    async def _sandbox(self, send: Send, sid: str) -> FakeSandbox | None:
        sb = self.world.get(sid)
        if sb is None:
            await respond_json(send, 404, {"code": 404, "message": f"sandbox \"{sid}\" doesn't exist or you "
                                           "don't have access to it"})
        return sb

    # sandboxes -----------------------------------------------------------------------------------
    async def create(self, send: Send, record: Recorded, body: Any) -> None:
        if not isinstance(body, dict) or not body.get("templateID"):
            await respond_json(send, 400, {"code": 400, "message": "templateID is required"})
            return
        template = str(body["templateID"])
        if template not in self.world.templates and template not in self.world.snapshots:
            await respond_json(send, 404, {"code": 404, "message": f"template '{template}' not found"})
            return
        timeout = body.get("timeout")
        if timeout is not None and (not isinstance(timeout, int) or timeout <= 0 or timeout > 86400):
            await respond_json(send, 400, {"code": 400, "message": "timeout must be 1..86400 seconds"})
            return
        try:
            egress_rules(body.get("network"))
        except InvalidRules as exc:
            await respond_json(send, 400, {"code": 400, "message": str(exc)})
            return
        sb = await self.blocking(self.world.create, body)
        record.sandbox_id = sb.sandbox_id
        if self.world.take_fault("POST", "/v2/sandboxes", ("drop",)):
            await send({"type": "http.response.start", "status": 201,
                        "headers": [(b"content-type", b"application/json"), (b"content-length", b"400")]})
            raise DropResponse("create response dropped on purpose")
        await respond_json(send, 201, sb.created())

    async def connect(self, send: Send, record: Recorded, body: Any, sid: str) -> None:
        sb = await self._sandbox(send, sid)
        if sb is None:
            return
        timeout = (body or {}).get("timeout")
        resumed = await self.blocking(self.world.connect, sb, timeout)
        await respond_json(send, 201 if resumed else 200, sb.created())

    async def list(self, send: Send, record: Recorded, body: Any) -> None:
        query = {k: v[0] for k, v in record.query.items()}
        wanted = {unquote(k): unquote(v) for k, v in parse_qsl(query.get("metadata", ""))}
        states = set(query.get("state", "running,paused").split(","))
        self.world.sweep()
        with self.world.lock:
            matching = [sb for sb in self.world.sandboxes.values()
                        if sb.state in states and wanted.items() <= sb.metadata.items()]
        page, headers = _page(matching, query)
        await respond_json(send, 200, [sb.listed() for sb in page], headers)

    async def info(self, send: Send, record: Recorded, body: Any, sid: str) -> None:
        sb = await self._sandbox(send, sid)
        if sb is not None:
            detail = {**sb.listed(), "envdAccessToken": sb.access_token, "domain": None,
                      "allowInternetAccess": sb.allow_internet_access, "network": dict(sb.network),
                      "lifecycle": {"onTimeout": "pause" if sb.auto_pause else "kill", "autoResume": False}}
            await respond_json(send, 200, detail)

    async def delete(self, send: Send, record: Recorded, body: Any, sid: str) -> None:
        sb = await self._sandbox(send, sid)
        if sb is not None:
            await self.blocking(self.world.kill, sb)
            await respond(send, 204)

    async def pause(self, send: Send, record: Recorded, body: Any, sid: str) -> None:
        sb = await self._sandbox(send, sid)
        if sb is None:
            return
        if sb.state == "paused":
            await respond_json(send, 409, {"code": 409, "message": f"sandbox {sid} is already paused"})
            return
        await self.blocking(self.world.pause, sb)
        await respond(send, 204)

    async def set_timeout(self, send: Send, record: Recorded, body: Any, sid: str) -> None:
        sb = await self._sandbox(send, sid)
        if sb is not None:
            sb.end_at = self.world.clock() + int((body or {}).get("timeout", 0))
            await respond(send, 204)

    async def update_network(self, send: Send, record: Recorded, body: Any, sid: str) -> None:
        """Replace the egress rules of a running sandbox (fields left out are cleared)."""
        sb = await self._sandbox(send, sid)
        if sb is None:
            return
        if sb.state != "running":
            await respond_json(send, 409, {"code": 409, "message": f"sandbox {sid} is not running"})
            return
        try:
            rules = egress_rules(body or {})
        except InvalidRules as exc:
            await respond_json(send, 400, {"code": 400, "message": str(exc)})
            return
        sb.network = rules
        if sb.local.spec.network == "proxy":  # enforced by the local sandbox's proxy (see local_spec)
            await self.blocking(sb.local.set_allow, local_allow(rules))
        if (body or {}).get("allow_internet_access") is not None:
            sb.allow_internet_access = body["allow_internet_access"]
        await respond(send, 204)

    # snapshots -----------------------------------------------------------------------------------
    async def create_snapshot(self, send: Send, record: Recorded, body: Any, sid: str) -> None:
        sb = await self._sandbox(send, sid)
        if sb is None:
            return
        snap = await self.blocking(self.world.snapshot, sb, (body or {}).get("name"))
        await respond_json(send, 201, {"snapshotID": snap.snapshot_id, "names": snap.names})

    async def list_snapshots(self, send: Send, record: Recorded, body: Any) -> None:
        query = {k: v[0] for k, v in record.query.items()}
        with self.world.lock:
            snaps = sorted(self.world.snapshots.values(), key=lambda s: s.created_at)
        if "sandboxID" in query:
            snaps = [s for s in snaps if s.source_id == query["sandboxID"]]
        if "name" in query:
            snaps = [s for s in snaps if query["name"] in (*s.names, s.snapshot_id)]
        page, headers = _page(snaps, query)
        await respond_json(send, 200, [{"snapshotID": s.snapshot_id, "names": s.names} for s in page], headers)

    async def delete_snapshot(self, send: Send, record: Recorded, body: Any, tid: str) -> None:
        with self.world.lock:
            snap = self.world.snapshots.pop(unquote(tid), None)
        if snap is None:
            await respond_json(send, 404, {"code": 404, "message": f"template '{tid}' not found"})
            return
        await respond(send, 204)


def _page(items: list[Any], query: dict[str, str]) -> tuple[list[Any], dict[str, str]]:
    """Offset paging behind an opaque token, as the API pages with ``x-next-token``."""
    limit = int(query.get("limit") or 100)
    start = int(query.get("nextToken") or 0)
    page = items[start:start + limit]
    more = start + limit < len(items)
    return page, ({"x-next-token": str(start + limit)} if more else {})
