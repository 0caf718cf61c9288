"""One loopback HTTP server that is both E2B planes: the control-plane REST API and every sandbox's
envd, told apart the way E2B's own proxy does it, by the ``E2b-Sandbox-Id`` header.

Point the real SDK at it with ``api_url=fake.url, sandbox_url=fake.url`` (or the environment
variables ``E2B_API_URL`` / ``E2B_SANDBOX_URL``). Plain http makes the SDK speak HTTP/1.1, which
uvicorn serves. The SDK sends ``X-API-KEY`` to the control plane and ``X-Access-Token`` (the
sandbox's ``envdAccessToken``) to envd; both are checked.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import uvicorn

from hermes_sandboxes.backends.local import LocalBackend
from tests.fakes.e2b import envd
from tests.fakes.e2b.control import ControlPlane
from tests.fakes.e2b.envd import Receive, Scope, Send, respond_json
from tests.fakes.e2b.world import FakeSandbox, Fault, Recorded, World

API_KEY = "e2b_fake_0123456789abcdef"  # what the fake accepts; tests pass it like a real key
ENVD_PATHS = ("/files", "/health")


class _DropStream(Exception):
    """Raised from a wrapped ``send``: the server then aborts the connection mid-response."""


class FakeE2B:
    """A running fake E2B account. Use as a context manager (or call ``close()``)."""

    def __init__(self, backend: LocalBackend, api_key: str = API_KEY) -> None:
        self.api_key = api_key
        self._executor = ThreadPoolExecutor(max_workers=32, thread_name_prefix="fake-e2b")
        self.world = World(backend, self._executor)
        self._control = ControlPlane(self.world)
        self._apps = envd.applications(self.world)
        self._ids = itertools.count(1)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        config = uvicorn.Config(self, log_level="critical", lifespan="off", access_log=False,
                                timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name="fake-e2b-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the fake E2B server did not start")
            time.sleep(0.005)

    # what tests use ------------------------------------------------------------------------------
    @property
    def requests(self) -> list[Recorded]:
        with self.world.lock:
            return list(self.world.requests)

    def calls(self, method: str | None = None, path: str | None = None, rpc: str | None = None) -> list[Recorded]:
        """Recorded requests, filtered by method, exact path or RPC name (``Process/Start``)."""
        return [r for r in self.requests if (method is None or r.method == method)
                and (path is None or r.path == path) and (rpc is None or r.rpc == rpc)]

    def clear_requests(self) -> None:
        with self.world.lock:
            self.world.requests.clear()

    def sandboxes(self) -> list[FakeSandbox]:
        self.world.sweep()
        with self.world.lock:
            return list(self.world.sandboxes.values())

    def sandbox(self, sandbox_id: str) -> FakeSandbox:
        sb = self.world.get(sandbox_id)
        assert sb is not None, f"no sandbox {sandbox_id} in the fake"
        return sb

    def fail(self, method: str, path: str, status: int = 500, *, times: int = 1, message: str = "injected",
             headers: dict[str, str] | None = None) -> None:
        """Answer the next ``times`` requests matching ``method`` and ``path`` (a regex) with ``status``."""
        self._arm(Fault(method, path, "status", status=status, times=times, headers=headers or {},
                        body={"code": status, "message": message}))

    def drop_create_response(self, times: int = 1) -> None:
        """Create the sandbox, then cut the connection before the client gets its id."""
        self._arm(Fault("POST", "/v2/sandboxes", "drop", times=times))

    def drop_stream(self, rpc: str = "Start", after_events: int = 1, times: int = 1) -> None:
        """Cut the next ``process.Process/<rpc>`` stream after ``after_events`` events (the start
        event counts); the process itself keeps running, as on E2B."""
        self._arm(Fault("POST", f"/process.Process/{rpc}", "drop_stream", after=after_events, times=times))

    def call_on(self, method: str, path: str, callback: Callable[[], None], *, times: int = 1) -> None:
        """Call ``callback`` (on the server's thread) when the next ``times`` requests matching
        ``method`` and ``path`` (a regex) arrive, then serve them as usual."""
        self._arm(Fault(method, path, "call", times=times, callback=callback))

    def pause(self, sandbox_id: str) -> None:
        """Pause a sandbox as its lease running out with on-timeout pause would."""
        self.world.pause(self.sandbox(sandbox_id))

    def expire(self, sandbox_id: str) -> None:
        """Run the sandbox's on-timeout action now (pause or kill), as E2B does when the lease ends."""
        self.world.expire(self.sandbox(sandbox_id))

    def _arm(self, fault: Fault) -> None:
        with self.world.lock:
            self.world.faults.append(fault)

    # lifecycle -----------------------------------------------------------------------------------
    def close(self) -> None:
        errors = self.world.close()
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._executor.shutdown(wait=False, cancel_futures=True)
        with contextlib.suppress(OSError):
            self._sock.close()
        assert not errors, f"fake E2B cleanup failed: {errors}"

    def __enter__(self) -> FakeE2B:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ASGI ----------------------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers = {k.decode().lower(): v.decode(errors="replace") for k, v in scope["headers"]}
        request_id = str(next(self._ids))
        record = Recorded(scope["method"], scope["path"], parse_qs(scope["query_string"].decode()),
                          headers, headers.get("e2b-sandbox-id"))
        with self.world.lock:
            self.world.requests.append(record)
        hook = self.world.take_fault(scope["method"], scope["path"], ("call",))
        if hook is not None and hook.callback is not None:
            hook.callback()
        fault = self.world.take_fault(scope["method"], scope["path"], ("status",))
        if fault is not None:
            await respond_json(send, fault.status, fault.body, fault.headers)
            return
        # A DropResponse or _DropStream raised below is on purpose: uvicorn closes the connection
        # of an app that fails mid-response, which is how a lost reply or a broken stream looks.
        if scope["path"] in ENVD_PATHS or "." in scope["path"].split("/")[1]:
            # envd RPC services find their request's record through this header
            scope = {**scope, "headers": [*scope["headers"], (b"x-fake-request", request_id.encode())]}
            record.headers["x-fake-request"] = request_id
            await self._envd(scope, receive, self._maybe_dropping(scope, send), record)
        elif headers.get("x-api-key") != self.api_key:
            await respond_json(send, 401, {"code": 401, "message": "Invalid API key"})
        else:
            await self._control(scope, receive, send, record)

    async def _envd(self, scope: Scope, receive: Receive, send: Send, record: Recorded) -> None:
        sandbox_id = record.headers.get("e2b-sandbox-id", "")
        sb = self.world.get(sandbox_id)
        if sb is None or sb.state != "running":  # what E2B's edge proxy answers for envd
            await respond_json(send, 502, {"code": 502, "message": f"The sandbox {sandbox_id} was not found"})
            return
        if record.headers.get("x-access-token") != sb.access_token:
            await respond_json(send, 401, {"code": 401, "message": "invalid access token"})
            return
        if scope["path"] == "/health":
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        if scope["path"] == "/files":
            await envd.files(self.world, sb, scope, receive, send, record)
            return
        for prefix, app in self._apps.items():
            if scope["path"].startswith(prefix):
                await app(scope, receive, send)
                return
        await respond_json(send, 404, {"code": "unimplemented", "message": "no such service"})

    def _maybe_dropping(self, scope: Scope, send: Send) -> Send:
        fault = self.world.take_fault(scope["method"], scope["path"], ("drop_stream",))
        if fault is None:
            return send
        sent = 0

        async def dropping(message: dict[str, Any]) -> None:
            nonlocal sent
            if message["type"] == "http.response.body" and message.get("body"):
                if sent >= fault.after:
                    raise _DropStream("stream dropped on purpose")
                sent += 1
            await send(message)

        return dropping


@contextlib.contextmanager
def running_fake(home: Path) -> Iterator[FakeE2B]:
    """A fake E2B whose sandboxes live in a local backend under ``home`` (torn down by the caller)."""
    fake = FakeE2B(LocalBackend(home))
    try:
        yield fake
    finally:
        fake.close()
