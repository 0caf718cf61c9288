"""The shared process pump: sink errors stop the command and surface from wait(), wait(timeout),
kill from any thread. Exercised with a real thread-backed process: its ``_run`` writes chunks until
killed, as a WebSocket reader or a streaming RPC would."""

from __future__ import annotations

import threading

import pytest

from hermes_sandboxes.backends.pump import Emit, PumpedProcess


class Ticker(PumpedProcess):
    """Emits ``chunks`` then ends with ``code``, or, with ``forever``, emits until killed (137)."""

    def __init__(self, chunks: list[bytes], code: int = 0, *, forever: bool = False, **sinks: object) -> None:
        super().__init__(sinks.get("on_stdout"), sinks.get("on_stderr"))  # type: ignore[arg-type]
        self._chunks, self._code, self._forever = chunks, code, forever
        self._killed = threading.Event()
        self.kills = 0
        self._begin("ticker")

    def _run(self, emit_stdout: Emit, emit_stderr: Emit) -> int:
        for chunk in self._chunks:
            emit_stdout(chunk)
            emit_stderr(chunk.upper())
        while self._forever and not self._killed.wait(0.001):
            emit_stdout(b".")
        return 137 if self._killed.is_set() else self._code

    def _kill(self) -> None:
        self.kills += 1
        self._killed.set()


def test_output_reaches_the_sinks_and_wait_returns_the_code() -> None:
    out: list[bytes] = []
    err: list[bytes] = []
    proc = Ticker([b"a", b"b"], 3, on_stdout=out.append, on_stderr=err.append)
    assert proc.wait(10) == 3 and proc.returncode == 3
    assert out == [b"a", b"b"] and err == [b"A", b"B"]


def test_a_failing_sink_kills_the_command_and_its_error_comes_out_of_wait() -> None:
    def broken(chunk: bytes) -> None:
        raise BrokenPipeError("reader gone")

    proc = Ticker([], forever=True, on_stdout=broken)
    with pytest.raises(BrokenPipeError):
        proc.wait(10)
    assert proc.kills == 1


def test_wait_with_a_timeout_returns_none_while_running_and_kill_ends_it() -> None:
    proc = Ticker([], forever=True)
    assert proc.wait(0.05) is None and proc.returncode is None
    threading.Thread(target=proc.kill).start()
    assert proc.wait(10) == 137
    proc.kill()  # after the end: a no-op
    assert proc.kills == 1


def test_an_error_of_the_pump_itself_is_raised_by_wait() -> None:
    class Lost(Ticker):
        def _run(self, emit_stdout: Emit, emit_stderr: Emit) -> int:
            raise ConnectionResetError("connection lost")

    proc = Lost([])
    with pytest.raises(ConnectionResetError):
        proc.wait(10)
    assert proc.returncode is None
