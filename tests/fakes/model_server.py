"""A scripted OpenAI-compatible model on 127.0.0.1, for driving a real Hermes agent loop in tests.

It speaks the part of the chat-completions API Hermes uses: ``POST /v1/chat/completions`` (streamed
as server-sent events when the request asks for ``stream``, plain JSON otherwise) and the
model-listing endpoints Hermes probes (``GET /v1/models``, ``/models``). Every request is recorded,
so a test can assert on exactly what the model was told (the tool results in particular).

The conversation is a script: a list of steps, each one either a final answer (``say``) or one or
more tool calls (``call``), or a function of the messages so far that returns such a step (for a
step that needs an id the agent only learned from an earlier tool result). Only requests that offer
tools advance the script: Hermes's auxiliary calls (titles, summaries) get a short plain answer.
When the script is exhausted the model answers ``done``.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "scripted-model"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Step:
    """What the model answers to one request: tool calls, or (when there are none) text."""

    text: str = ""
    calls: tuple[ToolCall, ...] = ()


StepFn = Callable[["Conversation"], Step]


def say(text: str) -> Step:
    return Step(text=text)


def call(name: str, **arguments: Any) -> Step:
    return Step(calls=(ToolCall(name, arguments),))


def calls(*pairs: tuple[str, dict[str, Any]]) -> Step:
    return Step(calls=tuple(ToolCall(n, a) for n, a in pairs))


@dataclass
class Conversation:
    """What a request told the model: its messages (tool results included) and the tools offered."""

    body: dict[str, Any]

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages") or [])

    @property
    def tool_names(self) -> list[str]:
        return [t.get("function", {}).get("name", "") for t in self.body.get("tools") or []]

    def tool_search_catalog(self) -> str:
        """The description of Hermes's tool search, which lists the deferred tools by name."""
        for tool in self.body.get("tools") or []:
            if tool.get("function", {}).get("name") == "tool_search":
                return str(tool["function"].get("description", ""))
        return ""

    def tool_results(self) -> list[str]:
        """The content of every tool message, oldest first."""
        return [_text(m.get("content")) for m in self.messages if m.get("role") == "tool"]

    def last_tool_result(self) -> str:
        results = self.tool_results()
        return results[-1] if results else ""

    def last_tool_json(self) -> dict[str, Any]:
        loaded = json.loads(self.last_tool_result())
        assert isinstance(loaded, dict)
        return loaded


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


@dataclass
class Recorded:
    method: str
    path: str
    body: dict[str, Any] | None


@dataclass
class ScriptedModel:
    """The server's state: the script, where it stands, and every request seen."""

    script: list[Step | StepFn] = field(default_factory=list)
    requests: list[Recorded] = field(default_factory=list)
    position: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def load(self, steps: Sequence[Step | StepFn]) -> None:
        with self.lock:
            self.script, self.position = list(steps), 0

    def agent_requests(self) -> list[Conversation]:
        """The requests of the agent loop (those that offered tools), in order."""
        return [Conversation(r.body) for r in self.requests
                if r.body is not None and r.body.get("tools")]

    def answer(self, body: dict[str, Any]) -> Step:
        if not body.get("tools"):
            return say("ok")
        with self.lock:
            if self.position >= len(self.script):
                return say("done")
            step = self.script[self.position]
            self.position += 1
        return step(Conversation(body)) if callable(step) else step

    def next_id(self) -> str:
        return f"call_{next(self.ids)}"


def _completion(model: ScriptedModel, step: Step, name: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": step.text or None}
    if step.calls:
        message["tool_calls"] = [
            {"id": model.next_id(), "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments)}} for c in step.calls]
    return {
        "id": f"chatcmpl-{model.next_id()}", "object": "chat.completion", "created": int(time.time()),
        "model": name,
        "choices": [{"index": 0, "message": message,
                     "finish_reason": "tool_calls" if step.calls else "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def _chunks(model: ScriptedModel, step: Step, name: str) -> Iterator[dict[str, Any]]:
    """The streamed form of one answer: role, then the text or each tool call, then the finish."""
    base = {"id": f"chatcmpl-{model.next_id()}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": name}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    yield chunk({"role": "assistant", "content": ""})
    if step.text:
        yield chunk({"content": step.text})
    for index, c in enumerate(step.calls):
        yield chunk({"tool_calls": [{"index": index, "id": model.next_id(), "type": "function",
                                     "function": {"name": c.name, "arguments": ""}}]})
        yield chunk({"tool_calls": [{"index": index, "function": {"arguments": json.dumps(c.arguments)}}]})
    yield chunk({}, "tool_calls" if step.calls else "stop")
    yield {**base, "choices": [],
           "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}


def _handler(model: ScriptedModel) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

        def _json(self, status: int, payload: Any) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            model.requests.append(Recorded("GET", self.path, None))
            path = self.path.split("?")[0].rstrip("/")
            if path.endswith("/models"):
                self._json(200, {"object": "list", "data": [
                    {"id": MODEL, "object": "model", "created": 0, "owned_by": "tests",
                     "context_length": 200_000}]})
            elif path.endswith(f"/models/{MODEL}"):
                self._json(200, {"id": MODEL, "object": "model", "created": 0, "owned_by": "tests",
                                 "context_length": 200_000})
            else:
                self._json(404, {"error": {"message": f"no {path} here", "type": "not_found"}})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                body = {"_raw": raw.decode(errors="replace")}
            model.requests.append(Recorded("POST", self.path, body))
            if not self.path.split("?")[0].rstrip("/").endswith("/chat/completions"):
                self._json(404, {"error": {"message": f"no {self.path} here", "type": "not_found"}})
                return
            step = model.answer(body)
            name = str(body.get("model") or MODEL)
            if not body.get("stream"):
                self._json(200, _completion(model, step, name))
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            for chunk in _chunks(model, step, name):
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

    return Handler


class ModelServer:
    """The scripted model served on 127.0.0.1 (an ephemeral port) until ``close()``."""

    def __init__(self) -> None:
        self.model = ScriptedModel()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.model))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-model", daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def play(self, steps: Sequence[Step | StepFn]) -> None:
        self.model.load(steps)
        self.model.requests.clear()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> ModelServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
