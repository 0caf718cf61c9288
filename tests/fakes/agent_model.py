"""A scripted model on 127.0.0.1 for real coding-agent clients: Codex CLI (the OpenAI Responses API,
``POST /v1/responses``), Claude Code (the Anthropic Messages API, ``POST /v1/messages``) and Gemini
CLI (``:streamGenerateContent``) and opencode (chat completions, ``POST /v1/chat/completions``),
streamed as server-sent events, as those clients ask.

The script is a list of steps; each sees what the model was told so far (every tool result of the
conversation, oldest first) and returns either a tool call (``use``) of one of the MCP server's
tools, by its bare name, or the final text (``say``). Which step answers a request is the number of
tool results in it, so a client's side requests (titles, summaries: no MCP tools offered) get a
short text and never advance the script. Each client's way of naming MCP tools is applied here:
Codex groups them in a ``namespace`` tool ``mcp__<server>``; Claude Code flattens them to
``mcp__<server>__<tool>``, Gemini CLI to ``mcp_<server>_<tool>``, opencode to ``<server>_<tool>``.
Every request is recorded, so a test asserts on what the model was told and which tools it was offered.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

WALL_TIME = re.compile(r"^Wall time: [0-9.]+ seconds\nOutput:\n")


@dataclass(frozen=True)
class Use:
    tool: str  # the MCP tool's bare name
    arguments: dict[str, Any]


def use(tool: str, **arguments: Any) -> Use:
    return Use(tool, arguments)


@dataclass(frozen=True)
class Told:
    """What one request told the model."""

    results: tuple[str, ...]  # the text of every tool result so far, oldest first
    tools: tuple[str, ...]  # the names of the tools offered, as the client names them

    @property
    def last(self) -> str:
        return self.results[-1] if self.results else ""

    def last_json(self) -> dict[str, Any]:
        """The last result parsed as JSON (our tools' text is JSON but for exec's)."""
        loaded = json.loads(self.last)
        assert isinstance(loaded, dict)
        return loaded


Step = Callable[[Told], "Use | str"]


@dataclass
class Recorded:
    path: str
    body: dict[str, Any]
    told: Told
    offers: bool = False  # the request offered the MCP server's tools (the agent loop's, not a side call)


@dataclass
class AgentModel:
    server: str  # the MCP server's name in the client's configuration
    script: list[Step | Use | str] = field(default_factory=list)
    requests: list[Recorded] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    ids: Any = field(default_factory=lambda: itertools.count(1))

    def answer(self, told: Told, offers_ours: bool) -> Use | str:
        if not offers_ours:
            return "ok"
        index = len(told.results)
        if index >= len(self.script):
            return "done"
        step = self.script[index]
        return step if isinstance(step, Use | str) else step(told)

    def next_id(self, kind: str) -> str:
        with self.lock:
            return f"{kind}_{next(self.ids)}"

    def agent_requests(self) -> list[Recorded]:
        """The requests that offered the MCP server's tools (the agent loop's, not side calls)."""
        return [r for r in self.requests if r.offers]


# -- the OpenAI Responses API (Codex CLI) ---------------------------------------------------------

def _responses_told(body: dict[str, Any]) -> tuple[Told, bool, str]:
    items = [i for i in body.get("input") or [] if isinstance(i, dict)]
    results = tuple(_output_text(i.get("output")) for i in items if i.get("type") == "function_call_output")
    names: list[str] = []
    for tool in body.get("tools") or []:
        names.append(str(tool.get("name")))
        if tool.get("type") == "namespace":
            names += [f"{tool.get('name')}.{t.get('name')}" for t in tool.get("tools") or []]
    return Told(results, tuple(names)), False, ""


def _output_text(output: Any) -> str:
    """A tool result as Codex hands it to the model, without the wall-time line it puts first.
    (Codex passes a tool's ``structuredContent`` as JSON text when there is one, else its content.)"""
    if isinstance(output, str):
        return WALL_TIME.sub("", output, count=1)
    if isinstance(output, list):  # content items; Codex prefixes its own "Wall time" item
        texts = [str(p.get("text", "")) for p in output if isinstance(p, dict)]
        return texts[-1] if texts else ""
    return json.dumps(output)


def _responses_events(model: AgentModel, answer: Use | str) -> list[tuple[str, dict[str, Any]]]:
    rid = model.next_id("resp")
    if isinstance(answer, Use):
        item: dict[str, Any] = {"type": "function_call", "id": model.next_id("fc"), "call_id": model.next_id("call"),
                                "namespace": f"mcp__{model.server}", "name": answer.tool,
                                "arguments": json.dumps(answer.arguments), "status": "completed"}
    else:
        item = {"type": "message", "id": model.next_id("msg"), "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": answer, "annotations": []}]}
    usage = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 5,
             "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 15}
    return [("response.created", {"type": "response.created", "response": {"id": rid}}),
            ("response.output_item.added", {"type": "response.output_item.added", "output_index": 0, "item": item}),
            ("response.output_item.done", {"type": "response.output_item.done", "output_index": 0, "item": item}),
            ("response.completed", {"type": "response.completed", "response": {"id": rid, "usage": usage}})]


# -- the Gemini API (Gemini CLI) ----------------------------------------------------------------

UNTRUSTED = re.compile(r"^<untrusted_context>\n?(.*?)\n?</untrusted_context>$", re.DOTALL)


def _gemini_told(body: dict[str, Any]) -> Told:
    results: list[str] = []
    for content in body.get("contents") or []:
        for part in content.get("parts") or []:
            answer = part.get("functionResponse") if isinstance(part, dict) else None
            if isinstance(answer, dict):
                output = (answer.get("response") or {}).get("output", "")
                text = output if isinstance(output, str) else json.dumps(output)
                found = UNTRUSTED.match(text)  # Gemini CLI wraps what a tool said
                results.append(found.group(1) if found else text)
    names = [str(f.get("name")) for tool in body.get("tools") or [] for f in tool.get("functionDeclarations") or []]
    return Told(tuple(results), tuple(names))


def _gemini_answer(model: AgentModel, answer: Use | str) -> dict[str, Any]:
    part: dict[str, Any] = ({"functionCall": {"name": f"mcp_{model.server}_{answer.tool}", "args": answer.arguments}}
                            if isinstance(answer, Use) else {"text": answer})
    return {"candidates": [{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15}}


# -- the OpenAI chat completions API (opencode, through @ai-sdk/openai-compatible) ----------------

def _chat_told(body: dict[str, Any]) -> Told:
    results = []
    for message in body.get("messages") or []:
        if message.get("role") == "tool":
            content = message.get("content")
            results.append(content if isinstance(content, str) else
                           "".join(str(p.get("text", "")) for p in content or [] if isinstance(p, dict)))
    return Told(tuple(results), tuple(str(t.get("function", {}).get("name")) for t in body.get("tools") or []))


def _chat_events(model: AgentModel, answer: Use | str) -> list[tuple[str, dict[str, Any]]]:
    base = {"id": model.next_id("chatcmpl"), "object": "chat.completion.chunk", "created": 0, "model": "scripted"}
    if isinstance(answer, Use):
        delta: dict[str, Any] = {"tool_calls": [{"index": 0, "id": model.next_id("call"), "type": "function",
                                                 "function": {"name": f"{model.server}_{answer.tool}",
                                                              "arguments": json.dumps(answer.arguments)}}]}
        finish = "tool_calls"
    else:
        delta, finish = {"content": answer}, "stop"
    chunks: list[dict[str, Any]] = [
              {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
              {"choices": [{"index": 0, "delta": delta}]},
              {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
              {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}]
    return [("", {**base, **chunk}) for chunk in chunks]


# -- the Anthropic Messages API (Claude Code) -----------------------------------------------------

def _messages_told(body: dict[str, Any]) -> Told:
    results: list[str] = []
    for message in body.get("messages") or []:
        content = message.get("content")
        if message.get("role") != "user" or not isinstance(content, list):
            continue
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                inner = block.get("content")
                if isinstance(inner, list):
                    results.append("".join(str(p.get("text", "")) for p in inner if isinstance(p, dict)))
                else:
                    results.append(str(inner or ""))
    return Told(tuple(results), tuple(str(t.get("name")) for t in body.get("tools") or []))


def _messages_events(model: AgentModel, answer: Use | str, name: str) -> list[tuple[str, dict[str, Any]]]:
    start = {"type": "message_start", "message": {
        "id": model.next_id("msg"), "type": "message", "role": "assistant", "model": name, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 1}}}
    if isinstance(answer, Use):
        block = {"type": "tool_use", "id": model.next_id("toolu"), "name": f"mcp__{model.server}__{answer.tool}",
                 "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(answer.arguments)}
        stop = "tool_use"
    else:
        block, delta, stop = {"type": "text", "text": ""}, {"type": "text_delta", "text": answer}, "end_turn"
    return [("message_start", start),
            ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                               "usage": {"output_tokens": 5}}),
            ("message_stop", {"type": "message_stop"})]


def _handler(model: AgentModel) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _json(self, status: int, payload: Any) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # model listings and probes
            self._json(200, {"object": "list", "data": [{"id": "scripted-model", "object": "model"}], "models": []})

        def do_HEAD(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            path = self.path.split("?")[0].rstrip("/")
            if ":countTokens" in path:
                self._json(200, {"totalTokens": 10})
                return
            if ":generateContent" in path or ":streamGenerateContent" in path:
                told = _gemini_told(body)
                offers = any(t.startswith(f"mcp_{model.server}_") for t in told.tools)
                with model.lock:
                    model.requests.append(Recorded(path, body, told, offers))
                # Gemini CLI's side calls (its model router) want JSON back
                answer = model.answer(told, offers) if offers else '{"reasoning": "simple", "model_choice": "flash"}'
                payload = _gemini_answer(model, answer)
                if ":generateContent" in path:
                    self._json(200, payload)
                    return
                events: list[tuple[str, dict[str, Any]]] = [("", payload)]
            elif path.endswith("/chat/completions"):
                told = _chat_told(body)
                offers = any(t.startswith(f"{model.server}_") for t in told.tools)
                with model.lock:
                    model.requests.append(Recorded(path, body, told, offers))
                events = _chat_events(model, model.answer(told, offers))
            elif path.endswith("/responses"):
                told = _responses_told(body)[0]
                events = _responses_events(model, self._answer(path, body, told))
            elif path.endswith("/messages"):
                told = _messages_told(body)
                events = _messages_events(model, self._answer(path, body, told), str(body.get("model") or "m"))
            else:
                self._json(404, {"error": {"message": f"no {path} here"}})
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            for name, data in events:
                head = f"event: {name}\n" if name else ""
                self.wfile.write(f"{head}data: {json.dumps(data)}\n\n".encode())
            if path.endswith("/chat/completions"):
                self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

        def _answer(self, path: str, body: dict[str, Any], told: Told) -> Use | str:
            offers = any(f"mcp__{model.server}" in t for t in told.tools)
            with model.lock:
                model.requests.append(Recorded(path, body, told, offers))
            return model.answer(told, offers)

    return Handler


class AgentModelServer:
    """The scripted model served on 127.0.0.1 (an ephemeral port) until ``close()``."""

    def __init__(self, server: str) -> None:
        self.model = AgentModel(server)
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.model))
        self._http.daemon_threads = True
        self._thread = threading.Thread(target=self._http.serve_forever, name="agent-model", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._http.server_address[:2]
        return f"http://{host!s}:{port}"

    def play(self, steps: Sequence[Step | Use | str]) -> None:
        with self.model.lock:
            self.model.script = list(steps)
            self.model.requests.clear()

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> AgentModelServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
