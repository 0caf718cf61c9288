"""Benchmarks of the Sprites backend over the loopback fake Sprites API, in one run.

Run as root (the fake's Sprites are local sandboxes): ``.venv/bin/python benchmarks/bench_sprites.py
[--quick] [--out FILE]``. The fake runs as a process of its own (``python -m tests.fakes.sprites``),
so the memory measured here is the client's alone; it removes its throw-away store when done.
Writes JSON (default benchmarks/results/sprites.json) and prints a Markdown table.

- exec round trip: ``Sandbox.exec(["true"])`` against the SDK's own ``Sprite.run("true")``, the two
  interleaved so both see the same load (target: ours <= 1.2x the SDK's).
- memory: peak growth of this process's resident set while a command prints 1 GB through
  ``exec`` (target <= 64 MB); for contrast, the SDK's own growth for 64 MB of output.
- sync: requests and time to write 1,000 small skill files (target: one request per file).
- checkpoint and restore round trips.
Fake-server numbers say nothing about the real service's latency; they measure our overhead.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
os.environ["SPRITES_CLIENT_SIGNALS"] = "0"

from sprites import SpritesClient  # noqa: E402

from hermes_sandboxes.backends.sprites import SpritesBackend, SpritesSandbox  # noqa: E402
from hermes_sandboxes.backends.sprites.settings import SpritesSettings  # noqa: E402

TARGETS = {"exec_overhead_ratio_max": 1.2, "print_1gb_peak_rss_mb_max": 64, "sync_requests_per_file": 1}


def median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 2)


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


class PeakRss:
    """Samples this process's resident set on a thread; ``growth`` is the peak above the start."""

    def __init__(self) -> None:
        self.start = rss_bytes()
        self.peak = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, rss_bytes())

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())

    @property
    def growth_mb(self) -> float:
        return round((self.peak - self.start) / 2**20, 1)


def requests_so_far(url: str, token: str) -> int:
    req = urllib.request.Request(f"{url}/_fake/requests", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as response:
        return len(json.loads(response.read()))


def bench_exec(sprite: SpritesSandbox, sdk: SpritesClient, n: int) -> dict[str, Any]:
    raw = sdk.sprite(sprite.name)
    for _ in range(5):  # warm both paths (connections, imports)
        sprite.exec(["true"])
        raw.run("true")
    ours, theirs = [], []
    for _ in range(n):
        ours.append(timed(lambda: sprite.exec(["true"])))
        theirs.append(timed(lambda: raw.run("true")))
    return {"samples": n, "ours_ms": median_ms(ours), "sdk_ms": median_ms(theirs),
            "ratio": round(statistics.median(ours) / statistics.median(theirs), 3)}


def bench_memory(sprite: SpritesSandbox, sdk: SpritesClient, size_mb: int) -> dict[str, Any]:
    seen = [0]

    def count(chunk: bytes) -> None:
        seen[0] += len(chunk)

    with PeakRss() as ours:
        started = time.perf_counter()
        result = sprite.exec(f"head -c {size_mb}M /dev/zero", on_stdout=count, timeout=600)
        elapsed = time.perf_counter() - started
    assert result.exit_code == 0 and seen[0] == size_mb << 20, (result.exit_code, seen[0])
    with PeakRss() as theirs:
        out = sdk.sprite(sprite.name).command("head", "-c", "64M", "/dev/zero").output()
    assert len(out) == 64 << 20
    del out
    return {"printed_mb": size_mb, "peak_rss_growth_mb": ours.growth_mb, "seconds": round(elapsed, 2),
            "throughput_mb_s": round(size_mb / elapsed, 1), "sdk_peak_rss_growth_mb_for_64mb": theirs.growth_mb}


def bench_sync(sprite: SpritesSandbox, url: str, token: str, files: int) -> dict[str, Any]:
    payloads = {f"/root/.hermes/skills/skill{i // 10:03d}/file{i % 10}.md": os.urandom(2048) for i in range(files)}
    before = requests_so_far(url, token)
    started = time.perf_counter()
    for path, data in payloads.items():
        sprite.write_file(path, data)
    elapsed = time.perf_counter() - started
    sent = requests_so_far(url, token) - before
    check = sprite.exec("find /root/.hermes/skills -type f | wc -l").stdout.strip()
    assert int(check) == files, check
    return {"files": files, "requests": sent, "requests_per_file": sent / files, "seconds": round(elapsed, 2),
            "ms_per_file": round(elapsed * 1000 / files, 2)}


def bench_checkpoints(sprite: SpritesSandbox, n: int) -> dict[str, Any]:
    sprite.exec("mkdir -p /root/work && seq 100000 > /root/work/data")
    create, restore = [], []
    for i in range(n):
        started = time.perf_counter()
        checkpoint = sprite.checkpoint(f"bench {i}")
        create.append(time.perf_counter() - started)
        sprite.exec("echo changed >> /root/work/data")
        restore.append(timed(functools.partial(sprite.restore, checkpoint.id)))
    return {"samples": n, "checkpoint_ms": median_ms(create), "restore_ms": median_ms(restore)}


def verdicts(results: dict[str, Any]) -> dict[str, bool]:
    return {
        "exec_overhead": results["exec"]["ratio"] <= TARGETS["exec_overhead_ratio_max"],
        "print_1gb_memory": results["memory"]["peak_rss_growth_mb"] <= TARGETS["print_1gb_peak_rss_mb_max"],
        "sync_one_request_per_file": results["sync"]["requests_per_file"] == TARGETS["sync_requests_per_file"],
    }


def table(results: dict[str, Any]) -> str:
    e, m, s, c = results["exec"], results["memory"], results["sync"], results["checkpoints"]
    rows = [
        ("exec round trip (median)", f"{e['ours_ms']} ms vs SDK {e['sdk_ms']} ms = {e['ratio']}x", "<= 1.2x"),
        (f"host memory while printing {m['printed_mb']} MB", f"+{m['peak_rss_growth_mb']} MB "
         f"(SDK: +{m['sdk_peak_rss_growth_mb_for_64mb']} MB for 64 MB)", "<= 64 MB"),
        (f"sync {s['files']} files", f"{s['requests']} requests, {s['seconds']} s", "1 request per file"),
        ("checkpoint / restore (median)", f"{c['checkpoint_ms']} ms / {c['restore_ms']} ms", "-"),
    ]
    lines = ["| measure | result | target |", "|---|---|---|"]
    return "\n".join([*lines, *(f"| {a} | {b} | {t} |" for a, b, t in rows)])


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="fewer samples, 128 MB of output and 100 files (a smoke run)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "sprites.json")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_sprites: must run as root (the fake's Sprites are local sandboxes)", file=sys.stderr)
        return 2
    server = subprocess.Popen([sys.executable, "-m", "tests.fakes.sprites"], cwd=REPO, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None and server.stdin is not None
    hello = json.loads(server.stdout.readline())
    url, token, home = hello["url"], hello["token"], hello["home"]
    results: dict[str, Any] = {}
    try:
        with SpritesBackend(SpritesSettings(api_url=url), token=token) as backend, \
                SpritesClient(token, base_url=url) as sdk:
            sprite = backend.open("bench-sprites")
            print("exec round trip...", file=sys.stderr)
            results["exec"] = bench_exec(sprite, sdk, 30 if args.quick else 200)
            print("memory while printing...", file=sys.stderr)
            results["memory"] = bench_memory(sprite, sdk, 128 if args.quick else 1024)
            print("file sync...", file=sys.stderr)
            results["sync"] = bench_sync(sprite, url, token, 100 if args.quick else 1000)
            print("checkpoints...", file=sys.stderr)
            results["checkpoints"] = bench_checkpoints(sprite, 3 if args.quick else 9)
            sprite.destroy()
    finally:
        server.stdin.close()
        server.wait(120)
    report = {"benchmark": "sprites", "quick": args.quick, "server": "loopback fake (tests/fakes/sprites)",
              "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version()},
              "targets": TARGETS, "results": results, "meets_targets": verdicts(results), "fake_home": home}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(results))
    print(f"\nwritten to {args.out}; targets met: {report['meets_targets']}")
    return 0 if all(report["meets_targets"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
