"""envd of the fake E2B: the SDK's own Connect RPC applications served with our service classes,
plus the plain HTTP routes ``/files`` and ``/health``.

Wire facts this follows (e2b 2.63, envd 0.6.x): commands arrive as ``process.Process/Start`` with
``{cmd, args, envs, cwd}`` (the SDK always sends ``/bin/bash -l -c <string>``) and an optional
``Connect-Timeout-Ms`` header; the stream answers a ``start`` event with the pid, then ``data``
events (stdout/stderr bytes, base64 in the JSON codec), then one ``end`` event; a process killed by a
signal ends with exit code -1 and status/error ``signal: killed`` as Go reports it. Closing the stream
does not kill the process; the deadline does. ``SendSignal`` and ``SendInput`` select a process by
pid; input of a process started with ``stdin: true`` is gathered until ``CloseStdin`` (this fake then
launches the command with it: interactive input is out of its scope).
"""

from __future__ import annotations

import asyncio
import email.message
import email.parser
import json
import posixpath
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from e2b.envd.filesystem import filesystem_pb as fs_pb
from e2b.envd.filesystem.filesystem_connect import Filesystem, FilesystemASGIApplication
from e2b.envd.process import process_pb as pb
from e2b.envd.process.process_connect import Process, ProcessASGIApplication
from protobuf import Oneof

from hermes_sandboxes.errors import SandboxFileNotFound
from tests.fakes.e2b.world import HOME, FakeProcess, FakeSandbox, Subscriber, World

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def _event(**kwargs: Any) -> pb.ProcessEvent:
    ((name, value),) = kwargs.items()
    return pb.ProcessEvent(event=Oneof(name, value))  # type: ignore[arg-type]  # the name is one of the oneof's


class _Base:
    def __init__(self, world: World) -> None:
        self.world = world

    def sandbox(self, ctx: Any) -> FakeSandbox:
        sandbox_id = ctx.request_headers.get("e2b-sandbox-id", "")
        sb = self.world.get(sandbox_id)
        if sb is None or sb.state != "running":  # the router answers these first; a race lands here
            raise ConnectError(Code.UNAVAILABLE, f"The sandbox {sandbox_id} was not found")
        return sb

    def record(self, ctx: Any, summary: dict[str, Any]) -> None:
        request_id = ctx.request_headers.get("x-fake-request", "")
        with self.world.lock:
            for rec in reversed(self.world.requests):
                if rec.headers.get("x-fake-request") == request_id:
                    rec.body = summary
                    return

    async def blocking(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.world.executor, fn, *args)


class ProcessService(_Base, Process):
    """``process.Process`` over the fake's local sandboxes (what is not here answers UNIMPLEMENTED)."""

    async def start(self, request: pb.StartRequest, ctx: Any) -> AsyncIterator[pb.StartResponse]:
        sb = self.sandbox(ctx)
        config = request.process or pb.ProcessConfig()
        cwd = config.cwd if config.has_field("cwd") else HOME
        env = {"HOME": HOME, "USER": "user", **sb.envs, **dict(config.envs)}
        proc = FakeProcess(next(sb.pids), [config.cmd, *config.args], env, cwd,
                           request.tag if request.has_field("tag") else None)
        timeout_ms = ctx.timeout_ms
        self.record(ctx, {"cmd": config.cmd, "args": list(config.args), "envs": dict(config.envs),
                          "cwd": config.cwd if config.has_field("cwd") else None,
                          "stdin": request.stdin if request.has_field("stdin") else None,
                          "timeout_ms": _header_ms(ctx)})
        sub = Subscriber(asyncio.get_running_loop())
        proc.subscribers.append(sub)
        with self.world.lock:
            sb.processes[proc.pid] = proc
        if request.has_field("stdin") and request.stdin:
            proc.stdin = bytearray()
        else:
            await self.blocking(proc.launch, sb.local, None)
        yield pb.StartResponse(event=_event(start=pb.ProcessEvent.StartEvent(pid=proc.pid)))
        deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
        async for event in self._follow(proc, sub, deadline):
            yield pb.StartResponse(event=event)

    async def connect(self, request: pb.ConnectRequest, ctx: Any) -> AsyncIterator[pb.ConnectResponse]:
        sb = self.sandbox(ctx)
        proc = self._find(sb, request.process)
        self.record(ctx, {"pid": proc.pid})
        sub = Subscriber(asyncio.get_running_loop())
        with proc.lock:
            proc.subscribers.append(sub)
        yield pb.ConnectResponse(event=_event(start=pb.ProcessEvent.StartEvent(pid=proc.pid)))
        timeout_ms = ctx.timeout_ms
        deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
        async for event in self._follow(proc, sub, deadline):
            yield pb.ConnectResponse(event=event)

    async def _follow(self, proc: FakeProcess, sub: Subscriber, deadline: float | None,
                      ) -> AsyncIterator[pb.ProcessEvent]:
        try:
            if proc.end is not None and proc.done.is_set() and sub.queue.empty():
                yield self._end_event(proc.end)
                return
            while True:
                wait = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    kind, payload = await asyncio.wait_for(sub.queue.get(), wait)
                except TimeoutError:
                    await self.blocking(proc.kill)  # envd ties the process to its stream's deadline
                    raise ConnectError(Code.DEADLINE_EXCEEDED, "the command's deadline passed") from None
                if kind == "end":
                    yield self._end_event(payload)
                    return
                yield _event(data=pb.ProcessEvent.DataEvent(output=Oneof(kind, payload)))  # type: ignore[arg-type]
        finally:
            with proc.lock:
                if sub in proc.subscribers:
                    proc.subscribers.remove(sub)
            sub.close()

    @staticmethod
    def _end_event(end: Any) -> pb.ProcessEvent:
        return _event(end=pb.ProcessEvent.EndEvent(exit_code=end.exit_code, exited=end.exited,
                                                    status=end.status, error=end.error))

    @staticmethod
    def _find(sb: FakeSandbox, selector: pb.ProcessSelector | None) -> FakeProcess:
        choice = selector.selector if selector is not None else None
        proc = None
        if choice is not None and choice.field == "pid":
            proc = sb.processes.get(int(choice.value))
        elif choice is not None and choice.field == "tag":
            proc = next((p for p in sb.processes.values() if p.tag == choice.value), None)
        if proc is None or not proc.running:
            raise ConnectError(Code.NOT_FOUND, f"process {choice.value if choice else '?'} not found")
        return proc

    async def send_signal(self, request: pb.SendSignalRequest, ctx: Any) -> pb.SendSignalResponse:
        sb = self.sandbox(ctx)
        proc = self._find(sb, request.process)
        self.record(ctx, {"pid": proc.pid, "signal": request.signal.name})
        inner = getattr(proc.local, "pid", None)  # the command's pid inside the local sandbox
        if request.signal.name == "SIGKILL" or not inner:
            await self.blocking(proc.kill)
        else:  # as envd does: the signal goes to the process, which may handle or ignore it
            await self.blocking(lambda: sb.local.exec(["kill", f"-{request.signal.name.removeprefix('SIG')}",
                                                       "--", str(inner)], timeout=30))
        return pb.SendSignalResponse()

    async def send_input(self, request: pb.SendInputRequest, ctx: Any) -> pb.SendInputResponse:
        proc = self._find(self.sandbox(ctx), request.process)
        data = request.input.input.value if request.input and request.input.input else b""
        self.record(ctx, {"pid": proc.pid, "bytes": len(data)})
        if proc.stdin is None:
            raise ConnectError(Code.FAILED_PRECONDITION, "the process was started without stdin")
        proc.stdin.extend(data)
        return pb.SendInputResponse()

    async def close_stdin(self, request: pb.CloseStdinRequest, ctx: Any) -> pb.CloseStdinResponse:
        sb = self.sandbox(ctx)
        proc = self._find(sb, request.process)
        self.record(ctx, {"pid": proc.pid})
        if proc.stdin is None or proc.local is not None:
            raise ConnectError(Code.FAILED_PRECONDITION, "stdin is not open")
        await self.blocking(proc.launch, sb.local, bytes(proc.stdin))
        return pb.CloseStdinResponse()

    async def list(self, request: pb.ListRequest, ctx: Any) -> pb.ListResponse:
        sb = self.sandbox(ctx)
        self.record(ctx, {})
        procs = [p for p in sb.processes.values() if p.running]
        return pb.ListResponse(processes=[
            pb.ProcessInfo(config=pb.ProcessConfig(cmd=p.argv[0], args=p.argv[1:], envs=p.env, cwd=p.cwd),
                           pid=p.pid, tag=p.tag) for p in procs])


class FilesystemService(_Base, Filesystem):
    """The parts of ``filesystem.Filesystem`` a backend needs: Stat, MakeDir, Remove."""

    async def stat(self, request: fs_pb.StatRequest, ctx: Any) -> fs_pb.StatResponse:
        sb = self.sandbox(ctx)
        self.record(ctx, {"path": request.path})
        return fs_pb.StatResponse(entry=await self.blocking(_stat, sb, request.path))

    async def make_dir(self, request: fs_pb.MakeDirRequest, ctx: Any) -> fs_pb.MakeDirResponse:
        sb = self.sandbox(ctx)
        self.record(ctx, {"path": request.path})
        result = await self.blocking(lambda: sb.local.exec(["mkdir", "--", request.path], timeout=30))
        if result.exit_code != 0:
            code = Code.ALREADY_EXISTS if "exists" in result.stderr else Code.INVALID_ARGUMENT
            raise ConnectError(code, result.stderr.strip())
        return fs_pb.MakeDirResponse(entry=await self.blocking(_stat, sb, request.path))

    async def remove(self, request: fs_pb.RemoveRequest, ctx: Any) -> fs_pb.RemoveResponse:
        sb = self.sandbox(ctx)
        self.record(ctx, {"path": request.path})
        await self.blocking(_stat, sb, request.path)  # NOT_FOUND for a missing path, as envd answers
        await self.blocking(lambda: sb.local.exec(["rm", "-rf", "--", request.path], timeout=60))
        return fs_pb.RemoveResponse()


def _header_ms(ctx: Any) -> int | None:
    """The deadline the client sent (Connect-Timeout-Ms), as sent."""
    raw = ctx.request_headers.get("connect-timeout-ms")
    return int(raw) if raw else None


def _stat(sb: FakeSandbox, path: str) -> fs_pb.EntryInfo:
    result = sb.local.exec(["stat", "-c", "%F|%s|%a|%U|%G", "--", path], timeout=30)
    if result.exit_code != 0:
        raise ConnectError(Code.NOT_FOUND, f"path not found: {path}")
    kind, size, mode, owner, group = result.stdout.strip().split("|")
    file_type = (fs_pb.FileType.DIRECTORY if kind == "directory" else
                 fs_pb.FileType.SYMLINK if kind == "symbolic link" else fs_pb.FileType.FILE)
    return fs_pb.EntryInfo(name=posixpath.basename(path), type=file_type, path=path, size=int(size),
                           mode=int(mode, 8), permissions=mode, owner=owner, group=group)


# plain HTTP routes -------------------------------------------------------------------------------
async def read_body(receive: Receive) -> bytes:
    body = bytearray()
    while True:
        message = await receive()
        body.extend(message.get("body", b""))
        if not message.get("more_body"):
            return bytes(body)


async def respond(send: Send, status: int, body: bytes = b"", content_type: str = "application/json",
                  headers: dict[str, str] | None = None) -> None:
    raw = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def respond_json(send: Send, status: int, data: Any, headers: dict[str, str] | None = None) -> None:
    await respond(send, status, json.dumps(data).encode(), headers=headers)


async def files(world: World, sb: FakeSandbox, scope: Scope, receive: Receive, send: Send,
                record: Any) -> None:
    """``GET /files?path=`` answers the bytes; ``POST /files`` writes octet-stream or multipart."""
    loop = asyncio.get_running_loop()
    query = parse_qs(scope["query_string"].decode())
    path = query.get("path", [""])[0]
    if scope["method"] == "GET":
        record.body = {"path": path}
        try:
            data = await loop.run_in_executor(world.executor, sb.local.read_file, _absolute(path))
        except SandboxFileNotFound:
            await respond_json(send, 404, {"code": 404, "message": f"path '{path}' does not exist"})
            return
        await respond(send, 200, data, "application/octet-stream")
        return
    body = await read_body(receive)
    content_type = dict(scope["headers"]).get(b"content-type", b"").decode()
    multipart = content_type.startswith("multipart/form-data")
    uploads = _multipart(content_type, body, path) if multipart else [(path, body)]
    record.body = {"paths": [p for p, _ in uploads], "bytes": sum(len(d) for _, d in uploads),
                   "content_type": content_type.split(";")[0]}
    for upload_path, data in uploads:
        await loop.run_in_executor(world.executor, _write, sb, _absolute(upload_path), data)
    await respond_json(send, 200, [{"name": posixpath.basename(p), "type": "file", "path": _absolute(p)}
                                   for p, _ in uploads])


def _write(sb: FakeSandbox, path: str, data: bytes) -> None:
    """envd creates missing parent directories of an upload."""
    try:
        sb.local.write_file(path, data)
    except SandboxFileNotFound:
        sb.local.exec(["mkdir", "-p", "--", posixpath.dirname(path)], timeout=30)
        sb.local.write_file(path, data)


def _absolute(path: str) -> str:
    return path if path.startswith("/") else posixpath.join(HOME, path)


def _multipart(content_type: str, body: bytes, default_path: str) -> list[tuple[str, bytes]]:
    message = email.parser.BytesParser().parsebytes(
        f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode() + body)
    uploads = []
    for part in message.get_payload():
        assert isinstance(part, email.message.Message), "a multipart upload's parts are messages"
        name = part.get_filename() or default_path
        data = part.get_payload(decode=True)
        uploads.append((default_path or name, data if isinstance(data, bytes) else b""))
    return uploads


def applications(world: World) -> dict[str, Any]:
    """The Connect applications keyed by their path prefix."""
    return {
        "/process.Process/": ProcessASGIApplication(ProcessService(world)),
        "/filesystem.Filesystem/": FilesystemASGIApplication(FilesystemService(world)),
    }
