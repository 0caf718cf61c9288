"""A loopback Sprites API for tests: the real sprites-py SDK talks to it over a real socket.

It serves the REST API (sprites, exec sessions and their kill endpoint, fs, checkpoints) and the
exec WebSocket (see execws.py) on 127.0.0.1 from a uvicorn thread, records every request it gets,
and injects faults on demand (see Fault). Each Sprite is a real local sandbox (see world.py).

It answers in the shapes the published sources show (docs/sprites.md names the source of each): a
create with a taken name is 400 "Invalid request body or name already exists" (``duplicate_status``
may make it 409) and a body with a field no source publishes is 400; a 429 carries an ``error``
code, ``retry_after_seconds`` and ``Retry-After``; checkpoint create streams progress whose last
message alone names the new id ("Checkpoint v3 created"); the list hides automatic checkpoints
unless ``includeAuto=true``; a restore answers at once and restarts the Sprite afterwards (exec is
refused meanwhile, running sessions end); the session list's envelope and command form follow
``session_envelope`` ("object" or "array") and ``session_command`` ("string" or "list"); a network
policy update answers ``policy_update_status`` (204 as sprites-go expects, or 200 as the API
reference shows) and is enforced through name resolution (world.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

import uvicorn

from hermes_sandboxes.backends.local import LocalBackend
from tests.fakes.sprites.execws import ExecConnection, ExecRequest, ExecSession, Sessions
from tests.fakes.sprites.world import Conflict, Missing, World, iso

Json = dict[str, Any] | list[Any]
# every create-body field a published source shows (API reference, sprites-py, sprites-go)
CREATE_FIELDS = {"name", "config", "url_settings", "labels", "wait_for_capacity", "runtime", "environment"}


@dataclass(frozen=True)
class Recorded:
    """One request as the server saw it (WebSocket upgrades have method "WS")."""

    method: str
    path: str
    query: tuple[tuple[str, str], ...]
    body_size: int
    status: int
    body: bytes = b""  # the first 4 KiB

    def param(self, key: str) -> str | None:
        return next((v for k, v in self.query if k == key), None)

    def params(self, key: str) -> list[str]:
        return [v for k, v in self.query if k == key]


@dataclass
class Fault:
    """What to do instead of (or on top of) answering the next ``times`` matching requests.

    ``path`` is a regular expression matched against the whole path; ``method`` is an HTTP
    method or "WS" for the exec WebSocket."""

    method: str
    path: str
    status: int | None = None  # answer with this error status, doing nothing
    retry_after: int | None = None  # with status 429: the Retry-After header and body field
    delay: float = 0.0  # seconds; a create is visible (status "creating") while it waits
    lose_response: bool = False  # do the work, then cut the connection before the answer is complete
    drop_exec: bool = False  # exec: close the WebSocket after the first output frame, without an exit
    message: str | None = None  # the error message of the injected status
    code: str | None = None  # with status 429: the error code (sprite_creation_rate_limited, ...)
    stream: list[dict[str, Any]] | None = None  # answer 200 with these NDJSON lines, doing nothing
    times: int = 1


@dataclass
class Reply:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)
    lose: bool = False

    @classmethod
    def json(cls, status: int, data: Json) -> Reply:
        return cls(status, json.dumps(data).encode())

    @classmethod
    def ndjson(cls, lines: list[dict[str, Any]]) -> Reply:
        return cls(200, b"".join(json.dumps(x).encode() + b"\n" for x in lines), "application/x-ndjson")

    @classmethod
    def error(cls, status: int, code: str, message: str) -> Reply:
        return cls.json(status, {"error": code, "message": message})


class FakeSprites:
    """The fake service. ``start()`` it, point ``SpritesClient(token, base_url=fake.url)`` at it,
    ``stop()`` it (which destroys every sandbox it made)."""

    def __init__(self, backend: LocalBackend, *, token: str = "fake-token", local_prefix: str = "fsp",
                 disconnect_grace: float = 10.0) -> None:
        self.token = token
        self.world = World(backend, local_prefix)
        self.sessions = Sessions()
        self.disconnect_grace = disconnect_grace
        self.duplicate_status = 400  # what a create with a taken name answers (the API reference: 400)
        self.session_envelope = "object"  # the session list: {"sessions": [...]} or a bare "array"
        self.session_command = "string"  # each session's command: one "string" or a "list" (older docs)
        self.restore_delay = 0.3  # seconds after the restore's answer until the Sprite is back
        self.policy_update_status = 204  # what a network policy update answers (204 or 200)
        self.restore_gate: threading.Event | None = None  # if set, the Sprite is back only once it is set
        self.requests: list[Recorded] = []
        self._faults: list[Fault] = []
        self._in_flight = 0  # HTTP requests being answered
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=48, thread_name_prefix="fake-sprites")
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # lifecycle -----------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeSprites:
        config = uvicorn.Config(self._app, host="127.0.0.1", port=0, ws="websockets-sansio", lifespan="off",
                                log_level=os.environ.get("FAKE_SPRITES_LOG", "critical"),  # "error" to debug
                                ws_ping_interval=None, interface="asgi3")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True, name="fake-sprites")
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the fake Sprites server did not start")
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self) -> list[str]:
        """Stop serving, kill what still runs, destroy every Sprite; returns cleanup errors."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(30)
        for session in list(self.sessions.all.values()):
            if session.process is not None and not session.done.is_set():
                session.process.kill()
        errors = self.world.destroy_all()
        self._pool.shutdown(wait=False, cancel_futures=True)
        return errors

    def quiesce(self, timeout: float = 60.0) -> None:
        """Wait until no HTTP request is being answered (a slow create a test gave up on, say)."""
        deadline = time.monotonic() + timeout
        while self._in_flight and time.monotonic() < deadline:
            time.sleep(0.02)

    def reset(self) -> None:
        """Forget recorded requests and pending faults (between tests)."""
        with self._lock:
            self.requests.clear()
            self._faults.clear()

    # faults and records ---------------------------------------------------------------------------
    def inject(self, fault: Fault) -> None:
        with self._lock:
            self._faults.append(fault)

    def _take_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.times > 0 and fault.method == method and re.fullmatch(fault.path, path):
                    fault.times -= 1
                    return fault
        return None

    def _record(self, method: str, path: str, query: list[tuple[str, str]], body: bytes, status: int) -> None:
        with self._lock:
            self.requests.append(Recorded(method, path, tuple(query), len(body), status, body[:4096]))

    def recorded(self, method: str | None = None, path: str | None = None) -> list[Recorded]:
        """Requests so far, optionally only those of ``method`` whose path fully matches ``path``."""
        with self._lock:
            found = list(self.requests)
        return [r for r in found if (method is None or r.method == method)
                and (path is None or re.fullmatch(path, r.path))]

    # ASGI -------------------------------------------------------------------------------------------
    async def _app(self, scope: dict[str, Any], receive: Callable[[], Any], send: Callable[..., Any]) -> None:
        if scope["type"] == "websocket":
            await self._websocket(scope, receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)

    def _authorized(self, scope: dict[str, Any]) -> bool:
        headers: dict[bytes, bytes] = dict(scope["headers"])
        return headers.get(b"authorization", b"") == f"Bearer {self.token}".encode()

    async def _http(self, scope: dict[str, Any], receive: Callable[[], Any], send: Callable[..., Any]) -> None:
        body = bytearray()
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        method, path = scope["method"], scope["path"]
        query = parse_qsl(scope["query_string"].decode(), keep_blank_values=True)
        loop = asyncio.get_running_loop()
        if not self._authorized(scope):
            reply = Reply.error(401, "unauthorized", "invalid or missing token")
        elif path == "/_fake/requests":  # for a client in another process (benchmarks); not recorded
            rows = [{"method": r.method, "path": r.path, "status": r.status, "body_size": r.body_size}
                    for r in self.recorded()]
            reply = Reply.json(200, rows)
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": reply.body})
            return
        else:
            fault = self._take_fault(method, path)
            with self._lock:
                self._in_flight += 1
            try:
                reply = await loop.run_in_executor(self._pool, self._answer, method, path, query, bytes(body), fault)
            finally:
                with self._lock:
                    self._in_flight -= 1
        self._record(method, path, query, bytes(body), reply.status)
        headers = [(b"content-type", reply.content_type.encode()),
                   *((k.encode(), v.encode()) for k, v in reply.headers)]
        if reply.lose:  # promise a body, send half of it, and let the connection die
            headers.append((b"content-length", str(len(reply.body) + 64).encode()))
            await send({"type": "http.response.start", "status": reply.status, "headers": headers})
            await send({"type": "http.response.body", "body": reply.body[:1], "more_body": True})
            raise ConnectionAbortedError("fake: response lost on purpose")
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        await send({"type": "http.response.body", "body": reply.body})

    def _answer(self, method: str, path: str, query: list[tuple[str, str]], body: bytes,
                fault: Fault | None) -> Reply:
        if fault is not None and fault.status is not None:
            if fault.delay:
                time.sleep(fault.delay)
            return _fault_reply(fault)
        if fault is not None and fault.stream is not None:
            return Reply.ndjson(fault.stream)
        if fault is not None and fault.delay and not (method == "POST" and path == "/v1/sprites"):
            time.sleep(fault.delay)
        try:
            reply = self._route(method, path, dict(query), body, fault)
        except Missing as exc:
            reply = Reply.error(404, "not_found", str(exc))
        except Conflict as exc:
            reply = Reply.error(self.duplicate_status, "bad_request" if self.duplicate_status == 400 else "conflict",
                                f"Invalid request body or name already exists: {exc}")
        except (ValueError, KeyError) as exc:
            reply = Reply.error(400, "bad_request", f"bad request: {exc}")
        except Exception as exc:
            reply = Reply.error(500, "internal", f"{type(exc).__name__}: {exc}")
        if fault is not None and fault.lose_response:
            reply.lose = True
        return reply

    def _route(self, method: str, path: str, q: dict[str, str], body: bytes, fault: Fault | None) -> Reply:
        parts = path.strip("/").split("/")
        if parts[:2] != ["v1", "sprites"]:
            return Reply.error(404, "not_found", f"no route {path}")
        if len(parts) == 2:
            if method == "POST":
                return self._create(json.loads(body or b"{}"), fault.delay if fault else 0.0)
            if method == "GET":
                return self._list(q)
        elif len(parts) == 3:
            return self._sprite(method, parts[2], json.loads(body or b"{}") if method == "PUT" else {})
        else:
            name, rest = parts[2], parts[3:]
            self.world.get(name)
            if rest[0] == "fs" and len(rest) == 2:
                return self._fs(method, name, rest[1], q, body)
            if rest == ["policy", "network"]:
                return self._policy(method, name, json.loads(body) if body else {})
            if rest[0] in ("exec", "checkpoint", "checkpoints"):
                return self._sub(method, name, rest, json.loads(body) if body else {}, q)
        return Reply.error(404, "not_found", f"no route {method} {path}")

    # sprites --------------------------------------------------------------------------------------
    def _create(self, data: dict[str, Any], delay: float) -> Reply:
        unknown = sorted(set(data) - CREATE_FIELDS)
        if unknown or not isinstance(data.get("name"), str):
            return Reply.error(400, "bad_request", f"Invalid request body: unknown field(s) {unknown}" if unknown
                               else "Invalid request body: name is required")
        name = data["name"]
        sprite = self.world.reserve(name, data.get("config") or {}, list(data.get("labels") or []), None)
        if delay:
            time.sleep(delay)
        try:
            self.world.build(sprite)
        except Exception:
            self.world.sprites.pop(name, None)
            raise
        return Reply.json(201, sprite.to_json())

    def _list(self, q: dict[str, str]) -> Reply:
        found, more = self.world.page(q.get("prefix", ""), int(q.get("max_results", "50")),
                                      q.get("continuation_token", ""))
        return Reply.json(200, {"sprites": [s.to_json() for s in found], "has_more": more,
                                "next_continuation_token": found[-1].name if more else None})

    def _sprite(self, method: str, name: str, data: dict[str, Any]) -> Reply:
        sprite = self.world.get(name)
        if method == "GET":
            return Reply.json(200, sprite.to_json())
        if method == "PUT":
            if "labels" in data:
                sprite.labels = list(data["labels"])
            return Reply.json(200, sprite.to_json())
        if method == "DELETE":
            for session in self.sessions.of(name):
                if session.process is not None:
                    session.process.kill()
            self.world.delete(name)
            return Reply(204)
        return Reply.error(405, "method_not_allowed", method)

    # exec sessions and checkpoints ----------------------------------------------------------------
    def _sub(self, method: str, name: str, rest: list[str], data: dict[str, Any], q: dict[str, str]) -> Reply:
        if rest == ["exec"] and method == "GET":
            sessions = [s.to_json(command_list=self.session_command == "list") for s in self.sessions.of(name)]
            return Reply.json(200, sessions if self.session_envelope == "array" else {"sessions": sessions})
        if len(rest) == 3 and rest[0] == "exec" and rest[2] == "kill" and method == "POST":
            timeout = float(data.get("timeout", 10))
            try:
                ended = self.sessions.kill(name, rest[1], timeout, str(data.get("signal", "SIGTERM")))
            except KeyError:
                return Reply.error(404, "not_found", f"session {rest[1]} not found")
            lines = [{"type": "info", "data": f"sent {data.get('signal', 'SIGTERM')} to session {rest[1]}"}]
            lines.append({"type": "complete", "data": f"session {rest[1]} exited"} if ended
                         else {"type": "error", "error": f"session {rest[1]} still running"})
            return Reply.ndjson(lines)
        if rest == ["checkpoint"] and method == "POST":
            cid = self.world.checkpoint(name, str(data.get("comment", "")))
            now = iso(time.time())
            return Reply.ndjson([{"type": "info", "data": "Creating checkpoint...", "time": now},
                                 {"type": "info", "data": "Stopping services...", "time": now},
                                 {"type": "info", "data": "Saving filesystem state...", "time": now},
                                 {"type": "complete", "data": f"Checkpoint {cid} created", "time": now}])
        if rest == ["checkpoints"] and method == "GET":
            return Reply.json(200, self.world.checkpoints(name, include_auto=q.get("includeAuto") == "true"))
        if len(rest) == 2 and rest[0] == "checkpoints" and method == "GET":
            return Reply.json(200, self.world.find_checkpoint(name, rest[1]))
        if len(rest) == 3 and rest[0] == "checkpoints" and rest[2] == "restore" and method == "POST":
            self.world.find_checkpoint(name, rest[1])
            self.world.begin_restart(name)  # exec is refused until the restore below is done
            threading.Thread(target=self._restore_later, args=(name, rest[1]), daemon=True).start()
            now = iso(time.time())
            return Reply.ndjson([{"type": "info", "data": f"Restoring to {rest[1]}...", "time": now},
                                 {"type": "complete", "data": f"Restore to {rest[1]} started", "time": now}])
        return Reply.error(404, "not_found", f"no route {method} {'/'.join(rest)}")

    def _policy(self, method: str, name: str, data: dict[str, Any]) -> Reply:
        if method == "GET":
            return Reply.json(200, {"rules": self.world.get(name).rules})
        if method != "POST":
            return Reply.error(405, "method_not_allowed", method)
        rules = data.get("rules")
        if not isinstance(rules, list) or not all(_valid_rule(r) for r in rules):
            return Reply.error(400, "bad_request", f"invalid policy: {data!r}")
        self.world.set_policy(name, rules)
        return Reply(self.policy_update_status)  # the Go SDK expects 204, the API reference shows 200

    def _restore_later(self, name: str, public: str) -> None:
        """The restore's asynchronous part: active sessions end, the filesystem goes back, the
        environment comes back up after ``restore_delay``."""
        try:
            for session in self.sessions.of(name):
                if session.process is not None:
                    session.process.kill()
            if self.restore_gate is not None:
                self.restore_gate.wait(60)
            else:
                time.sleep(self.restore_delay)
            self.world.restore(name, public)
        finally:
            self.world.end_restart(name)

    # filesystem -----------------------------------------------------------------------------------
    def _fs(self, method: str, name: str, op: str, q: dict[str, str], body: bytes) -> Reply:
        path = _absolute(q["path"], q.get("workingDir", "/"))
        if op == "write" and method == "PUT":
            mode = int(q.get("mode", "0644"), 8)
            self.world.write(name, path, body, mode, q.get("mkdirParents", "false") == "true")
            return Reply.json(200, {"path": path, "size": len(body), "mode": f"{mode:04o}"})
        if op == "read" and method == "GET":
            return Reply(200, self.world.read(name, path), "application/octet-stream")
        if op == "list" and method == "GET":
            entries = self.world.listing(name, path)
            return Reply.json(200, {"path": path, "entries": entries, "count": len(entries)})
        if op == "delete" and method == "DELETE":
            self.world.remove(name, path, q.get("recursive") == "true")
            return Reply.json(200, {"deleted": [path], "count": 1})
        return Reply.error(404, "not_found", f"no fs route {method} {op}")

    # the exec WebSocket ------------------------------------------------------------------------------
    async def _websocket(self, scope: dict[str, Any], receive: Callable[[], Any], send: Callable[..., Any]) -> None:
        path = scope["path"]
        query = parse_qsl(scope["query_string"].decode(), keep_blank_values=True)
        await receive()  # websocket.connect
        match = re.fullmatch(r"/v1/sprites/([^/]+)/exec", path)
        fault = self._take_fault("WS", path)
        sprite = self.world.sprites.get(match.group(1)) if match else None
        refusal = None
        if not self._authorized(scope):
            refusal = Reply.error(401, "unauthorized", "invalid or missing token")
        elif fault is not None and fault.status is not None:
            refusal = _fault_reply(fault)
        elif sprite is None or sprite.sandbox is None:
            refusal = Reply.error(404, "not_found", f"no sprite for {path}")
        elif sprite.restarting:
            refusal = Reply.error(503, "unavailable", "the sprite is restarting")
        request = ExecRequest.parse(query)
        if refusal is None and not request.argv:
            refusal = Reply.error(400, "bad_request", "no cmd given")
        self._record("WS", path, query, b"", refusal.status if refusal else 101)
        if refusal is not None:
            headers = [(b"content-type", b"application/json"),
                       *((k.encode(), v.encode()) for k, v in refusal.headers)]
            await send({"type": "websocket.http.response.start", "status": refusal.status, "headers": headers})
            await send({"type": "websocket.http.response.body", "body": refusal.body})
            return
        assert sprite is not None
        session = ExecSession(sprite, request.argv, request.cwd, request.tty)
        self.sessions.all[session.id] = session
        connection = ExecConnection(session, request, send, receive, self._pool, grace=self.disconnect_grace,
                                    drop_after_output=bool(fault and fault.drop_exec))
        await connection.run()


def _valid_rule(rule: Any) -> bool:
    """A rule as the published sources show them: a domain with allow or deny, or an include."""
    if not isinstance(rule, dict):
        return False
    if set(rule) == {"include"}:
        return bool(rule["include"] == "defaults")
    domain = rule.get("domain")
    return (set(rule) == {"domain", "action"} and rule.get("action") in ("allow", "deny")
            and isinstance(domain, str) and re.fullmatch(r"\*|(\*\.)?[a-z0-9-]+(\.[a-z0-9-]+)*", domain) is not None)


def _fault_reply(fault: Fault) -> Reply:
    assert fault.status is not None
    if fault.status == 429:
        reply = Reply.json(429, {"error": fault.code or "sprite_creation_rate_limited",
                                 "message": fault.message or "too many requests", "limit": 10, "window_seconds": 60,
                                 "retry_after_seconds": fault.retry_after})
        if fault.retry_after is not None:
            reply.headers.append(("Retry-After", str(fault.retry_after)))
        return reply
    return Reply.error(fault.status, "injected", fault.message or f"injected failure {fault.status}")


def _absolute(path: str, working_dir: str) -> str:
    if path.startswith("/"):
        return path
    return working_dir.rstrip("/") + "/" + path

