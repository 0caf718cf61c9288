"""What one sandbox can add to the host's audit log and the proxy's own log: clipped, aggregated, capped.

Everything an egress record says comes from inside (the host it asked for, the reason built from
it), and a sandbox can open connections as fast as the host accepts them; the log lives on the
host, outside the sandbox's disk quota. So:

- every field is clipped (``MAX_HOST`` and ``MAX_REASON`` characters);
- records with the same verdict, host, port, reason and credential within ``WINDOW_S`` are
  aggregated: the first ``BURST`` are written at once (a refusal before the client hears of it),
  the rest become one record at the window's end, its ``count`` saying how many connections it
  stands for and its byte counts their sum;
- one proxy process writes at most ``BUDGET_BYTES`` of records (about); past that, one record per
  window says how many connections went unrecorded;
- the proxy's own log (its stderr) gets one clipped line per event, and at most ``LOG_BUDGET_BYTES``.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from hermes_sandboxes.recorder.journal import EgressRecord

MAX_HOST = 255
MAX_REASON = 300
WINDOW_S = 10.0
BURST = 5
BUDGET_BYTES = 16 * 1024 * 1024
LOG_BUDGET_BYTES = 1024 * 1024
_RECORD_BYTES = 400  # what one record costs the log, about: what the budget counts
_MAX_BUCKETS = 4096  # keys aggregated at once; past that, new keys are written as they come
_Key = tuple[str, str, int, str, str | None]


def clip(text: str, limit: int) -> str:
    """``text`` on one line, at most ``limit`` characters (a clipped end says how much went)."""
    flat = text.replace("\r", " ").replace("\n", " ")
    return flat if len(flat) <= limit else f"{flat[:limit - 24]}... ({len(flat) - limit + 24} more)"


@dataclass
class _Bucket:
    opened: float
    written: int = 0
    pending: EgressRecord | None = None


class AuditLimiter:
    """Passes egress records on to ``write`` (the audit journal's append), within the limits above.
    Thread-safe; ``clock`` is monotonic seconds."""

    def __init__(self, write: Callable[[EgressRecord], object], *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._write = write
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[_Key, _Bucket] = {}
        self._spent = 0
        self._unrecorded = 0
        self._summarised = float("-inf")
        self._sandbox = ""

    def submit(self, record: EgressRecord) -> None:
        record = replace(record, host=clip(record.host, MAX_HOST), reason=clip(record.reason, MAX_REASON))
        key: _Key = (record.verdict, record.host, record.port, record.reason, record.credential)
        now = self._clock()
        with self._lock:
            out = self._expired(now)
            bucket = self._buckets.get(key)
            if bucket is None and len(self._buckets) < _MAX_BUCKETS:
                bucket = self._buckets[key] = _Bucket(now)
            if bucket is None:
                out.append(record)
            elif bucket.written < BURST:
                bucket.written += 1
                out.append(record)
            else:
                bucket.pending = record if bucket.pending is None else _merged(bucket.pending, record)
            out = self._within_budget(out, now)
        for item in out:
            self._write(item)

    def tick(self) -> None:
        """Write the aggregates whose window has ended (the proxy calls this every second)."""
        now = self._clock()
        with self._lock:
            out = self._within_budget(self._expired(now), now)
        for item in out:
            self._write(item)

    def _expired(self, now: float) -> list[EgressRecord]:
        """Close the windows that have ended. Buckets are kept in the order they opened, so the
        walk stops at the first one still open: each record costs O(1), however many keys."""
        ended = []
        for key, bucket in self._buckets.items():
            if now - bucket.opened < WINDOW_S:
                break
            ended.append(key)
        out = []
        for key in ended:
            pending = self._buckets.pop(key).pending
            if pending is not None:
                out.append(pending)
        return out

    def _within_budget(self, records: list[EgressRecord], now: float) -> list[EgressRecord]:
        """The records the budget has room for; past it, at most one record per window with the
        number of connections left unrecorded."""
        kept = []
        for record in records:
            if self._spent + _RECORD_BYTES <= BUDGET_BYTES:
                self._spent += _RECORD_BYTES
                kept.append(record)
            else:
                self._unrecorded += record.count
                self._sandbox = record.sandbox
        if self._unrecorded and now - self._summarised >= WINDOW_S:
            kept.append(EgressRecord(sandbox=self._sandbox, host="*", port=0, verdict="refused",
                                     count=self._unrecorded,
                                     reason=f"{self._unrecorded} connections not recorded one by one: "
                                            "this proxy reached its audit log budget"))
            self._unrecorded, self._summarised = 0, now
        return kept


def _merged(a: EgressRecord, b: EgressRecord) -> EgressRecord:
    return replace(b, count=a.count + b.count, bytes_out=a.bytes_out + b.bytes_out,
                   bytes_in=a.bytes_in + b.bytes_in)


class LogBudget:
    """One-line messages to the proxy's stderr, clipped, at most ``LOG_BUDGET_BYTES`` in all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spent = 0
        self._silent = False

    def write(self, message: str) -> None:
        line = f"hermes-sandboxes egress proxy: {clip(message, 400)}\n"
        with self._lock:
            if self._silent:
                return
            if self._spent + len(line) > LOG_BUDGET_BYTES:
                line = "hermes-sandboxes egress proxy: log budget reached; further messages dropped\n"
                self._silent = True
            self._spent += len(line)
        try:
            sys.stderr.write(line)
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
