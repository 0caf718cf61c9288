"""The streamable HTTP transport: ``POST /mcp`` on 127.0.0.1 only, for clients that connect by URL.

Every request must pass three checks before anything else happens:

- ``Host`` names this loopback address and port (``127.0.0.1``, ``localhost`` or ``[::1]``), and an
  ``Origin``, when the request has one, is such a loopback origin too: a web page that points a
  rebinding DNS name at 127.0.0.1 is refused (403), as the MCP specification requires;
- ``Authorization: Bearer <token>``: the token is made on first use and kept in
  ``<state>/mcp/token`` (0600, in a 0700 directory); the server never prints it (401 otherwise).

``initialize`` opens a session and its response carries ``Mcp-Session-Id``, which every later
request must send (404 for an unknown one). A POST of notifications or responses is answered 202.
A POST of requests is answered with ``text/event-stream`` when the client accepts it (the progress
notifications of a running command, then the response) or with one JSON response. ``DELETE`` ends
the session (its commands are killed, its ephemeral sandboxes destroyed); ``GET`` offers no stream
(405): this server sends nothing unasked.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import queue
import secrets
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any

from hermes_sandboxes.mcp.protocol import PROTOCOL_VERSIONS, Session
from hermes_sandboxes.mcp.server import Running

LOOPBACK = "127.0.0.1"
PATH = "/mcp"
TOKEN_FILE = "token"
MAX_BODY = 32 * 2**20
SESSION_HEADER = "Mcp-Session-Id"


def token_path(state_dir: Path) -> Path:
    return state_dir / "mcp" / TOKEN_FILE


def load_token(state_dir: Path) -> str:
    """The server's bearer token, made on first use (0600 in a 0700 directory)."""
    path = token_path(state_dir)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path.parent, 0o700)
    try:
        token = path.read_text().strip()
        if token:
            os.chmod(path, 0o600)
            return token
    except FileNotFoundError:
        pass
    token = secrets.token_urlsafe(32)
    temp = path.with_name(f".{TOKEN_FILE}.{os.getpid()}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    try:
        os.link(temp, path)  # first writer wins: two servers starting at once agree on one token
    except FileExistsError:
        token = path.read_text().strip()
    finally:
        temp.unlink()
    return token


class _Routes:
    """Where a session's outgoing messages go: each response and each progress notification to the
    POST that carries its request (anything else has nowhere to go: this server sends nothing else)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_id: dict[Any, queue.Queue[dict[str, Any]]] = {}
        self._by_token: dict[Any, queue.Queue[dict[str, Any]]] = {}

    def open(self, request: dict[str, Any]) -> queue.Queue[dict[str, Any]]:
        inbox: queue.Queue[dict[str, Any]] = queue.Queue()
        params = request.get("params")
        meta = params.get("_meta") if isinstance(params, dict) else None
        with self._lock:
            self._by_id[request["id"]] = inbox
            if isinstance(meta, dict) and meta.get("progressToken") is not None:
                self._by_token[meta["progressToken"]] = inbox
        return inbox

    def close(self, request: dict[str, Any]) -> None:
        with self._lock:
            inbox = self._by_id.pop(request["id"], None)
            for token in [t for t, q in self._by_token.items() if q is inbox]:
                del self._by_token[token]

    def send(self, message: dict[str, Any]) -> None:
        with self._lock:
            if "id" in message and "method" not in message:
                inbox = self._by_id.get(message["id"])
            elif message.get("method") == "notifications/progress":
                inbox = self._by_token.get((message.get("params") or {}).get("progressToken"))
            else:
                inbox = None
        if inbox is not None:
            inbox.put(message)


class HttpServer:
    """The listening server and its sessions."""

    def __init__(self, running: Running, port: int, token: str) -> None:
        self.running = running
        self.token = token
        self.sessions: dict[str, tuple[Session, _Routes]] = {}
        self.lock = threading.Lock()
        self.http = ThreadingHTTPServer((LOOPBACK, port), _handler(self))
        self.http.daemon_threads = True
        self.http.block_on_close = False  # a client's idle keep-alive connection must not hold up our exit
        self.port = int(self.http.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}{PATH}"

    def allowed_hosts(self) -> set[str]:
        return {f"{host}:{self.port}" for host in (LOOPBACK, "localhost", "[::1]")}

    def open_session(self) -> tuple[str, Session, _Routes]:
        routes = _Routes()
        session_id = secrets.token_urlsafe(24)
        session = self.running.open_session(routes.send, session_id=f"http-{session_id[:12]}")
        with self.lock:
            self.sessions[session_id] = (session, routes)
        return session_id, session, routes

    def end_session(self, session_id: str) -> bool:
        with self.lock:
            found = self.sessions.pop(session_id, None)
        if found is None:
            return False
        found[0].close()
        return True

    def serve(self) -> None:
        self.http.serve_forever(poll_interval=0.2)

    def close(self) -> None:
        """After ``serve`` returned: close the socket, end every session, clean up."""
        self.http.server_close()
        with self.lock:
            ids = list(self.sessions)
        for session_id in ids:
            self.end_session(session_id)
        self.running.close()


class _Handler(BaseHTTPRequestHandler):
    """One HTTP request; ``owner`` is the server it belongs to (set by ``_handler``)."""

    owner: HttpServer
    protocol_version = "HTTP/1.1"
    server_version = "hermes-sandboxes-mcp"

    def log_message(self, format: str, *args: Any) -> None:
        return  # requests carry the token: nothing of them goes to a log

    def _refuse(self, status: int, message: str, **headers: str) -> None:
        body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": message}}).encode()
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _admitted(self) -> bool:
        """The DNS-rebinding and token checks, answered with a refusal when one fails."""
        host = self.headers.get("Host", "")
        origin = self.headers.get("Origin")
        if host not in self.owner.allowed_hosts():
            self._refuse(403, f"Host {host!r} is not this server's loopback address")
            return False
        if origin is not None and origin.removeprefix("http://") not in self.owner.allowed_hosts():
            self._refuse(403, f"Origin {origin!r} may not use this server")
            return False
        given = self.headers.get("Authorization", "")
        expected = f"Bearer {self.owner.token}"
        if not hmac.compare_digest(given.encode(), expected.encode()):
            self._refuse(401, "a bearer token is required (see docs/mcp.md: the token file)",
                         **{"WWW-Authenticate": 'Bearer realm="hermes-sandboxes"'})
            return False
        if self.path.split("?")[0] != PATH:
            self._refuse(404, f"the MCP endpoint is {PATH}")
            return False
        return True

    def do_GET(self) -> None:
        if self._admitted():
            self._refuse(405, "this server sends no messages unasked: no stream to open", Allow="POST, DELETE")

    def do_DELETE(self) -> None:
        if not self._admitted():
            return
        if not self.owner.end_session(self.headers.get(SESSION_HEADER, "")):
            self._refuse(404, "no such session")
            return
        self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        if not self._admitted():
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._refuse(413, f"a request body is at most {MAX_BODY} bytes")
            return
        try:
            body = json.loads(self.rfile.read(length) or b"null")
        except ValueError:
            self._refuse(400, "the body is not JSON")
            return
        messages = body if isinstance(body, list) else [body]
        if not messages or not all(isinstance(m, dict) for m in messages):
            self._refuse(400, "the body is not a JSON-RPC message")
            return
        opened_here = None
        if any(m.get("method") == "initialize" for m in messages):
            session_id, session, routes = self.owner.open_session()
            opened_here = session_id
        else:
            with self.owner.lock:
                found = self.owner.sessions.get(self.headers.get(SESSION_HEADER, ""))
            if found is None:
                self._refuse(404 if self.headers.get(SESSION_HEADER) else 400,
                             "unknown or missing Mcp-Session-Id: initialize first")
                return
            session, routes = found
            session_id = self.headers.get(SESSION_HEADER, "")
            version = self.headers.get("MCP-Protocol-Version")
            if version is not None and version not in PROTOCOL_VERSIONS:
                self._refuse(400, f"unsupported MCP-Protocol-Version {version!r}")
                return
        requests = [m for m in messages if "method" in m and "id" in m]
        if not requests:
            session.receive(body)
            self.send_response(202)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self._answer(session, routes, body, requests, session_id if opened_here else None)

    def _answer(self, session: Session, routes: _Routes, body: Any, requests: list[dict[str, Any]],
                new_session: str | None) -> None:
        inboxes = [(r, routes.open(r)) for r in requests]
        try:
            session.receive(body)
            streaming = "text/event-stream" in self.headers.get("Accept", "")
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream" if streaming else "application/json")
            if new_session is not None:
                self.send_header(SESSION_HEADER, new_session)
            if streaming:
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                for request, inbox in inboxes:
                    self._stream(session, request, inbox)
                self.close_connection = True
                return
            answers = [a for r, inbox in inboxes if (a := self._wait(session, r, inbox, None)) is not None]
            data = json.dumps(answers if isinstance(body, list) else (answers[0] if answers else {})).encode()
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away; a command it started runs on until cancelled or the session ends
        finally:
            for request, _ in inboxes:
                routes.close(request)

    def _stream(self, session: Session, request: dict[str, Any], inbox: queue.Queue[dict[str, Any]]) -> None:
        def event(message: dict[str, Any]) -> None:
            self.wfile.write(f"event: message\ndata: {json.dumps(message)}\n\n".encode())
            self.wfile.flush()

        answer = self._wait(session, request, inbox, event)
        if answer is not None:
            event(answer)

    def _wait(self, session: Session, request: dict[str, Any], inbox: queue.Queue[dict[str, Any]],
              on_progress: Any) -> dict[str, Any] | None:
        """The response to ``request`` (None if it was cancelled and will get none), passing
        progress notifications to ``on_progress`` (dropped when None) meanwhile."""
        while True:
            try:
                message = inbox.get(timeout=0.25)
            except queue.Empty:
                if not session.in_flight(request["id"]) and inbox.empty():
                    return None
                continue
            if "method" not in message:
                return message
            if on_progress is not None:
                on_progress(message)



def _handler(server: HttpServer) -> type[BaseHTTPRequestHandler]:
    return type("Handler", (_Handler,), {"owner": server})


def serve_http(running: Running, *, port: int, state_dir: Path) -> int:
    """Serve until SIGTERM, SIGHUP or SIGINT; then end every session and clean up."""
    server = HttpServer(running, port, load_token(state_dir))

    def ended(signum: int, frame: FrameType | None) -> None:
        # an exception raised here could land inside socketserver's request handling, which would
        # swallow it: stop the serving loop from another thread instead (shutdown() waits for it)
        threading.Thread(target=server.http.shutdown, name="mcp-http-shutdown", daemon=True).start()

    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, ended)
    print(f"hermes-sandboxes mcp: serving {server.url} (bearer token in {token_path(state_dir)})",
          file=sys.stderr, flush=True)
    try:
        server.serve()
    finally:
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(signum, signal.SIG_IGN)
        with contextlib.suppress(Exception):
            server.close()
    return 0
