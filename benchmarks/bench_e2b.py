"""The E2B backend over the loopback fake E2B (tests/fakes/e2b), one run.

Run (as root, the fake's sandboxes are local sandboxes): python benchmarks/bench_e2b.py
Writes benchmarks/results/e2b.json and prints a summary.

- exec round trip of `true`: our backend (extend-only lease call + command stream) against the raw
  SDK's `commands.run` on the same sandbox (target: ours <= 1.2x the SDK's);
- host memory (peak RSS of a separate client process) while a command prints 1 GiB through our
  backend (target <= 64 MB), and the raw SDK's default handle on 256 MiB for contrast (it keeps every
  chunk);
- time and requests to sync 1,000 small files: one write_file each, against one tar upload;
- checkpoint (snapshot) and restore round trips.
The fake runs in this process; the memory client in a child process so only its own memory counts.
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import e2b  # noqa: E402

from hermes_sandboxes.backends.e2b import E2BBackend  # noqa: E402
from hermes_sandboxes.backends.e2b.settings import E2BSettings  # noqa: E402

if TYPE_CHECKING:
    from tests.fakes.e2b import FakeE2B

API_KEY = "e2b_fake_0123456789abcdef"  # the fake's (tests/fakes/e2b/server.py); the child imports no fake

RESULTS = ROOT / "benchmarks" / "results" / "e2b.json"
PROFILE = "/bench/profile"
GIB = 1 << 30


def median_ms(n: int, step: Callable[[], object]) -> float:
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        step()
        samples.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(samples), 3)


def backend_for(url: str) -> E2BBackend:
    return E2BBackend(E2BSettings(), api_key=API_KEY, profile=PROFILE, api_url=url, sandbox_url=url)


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError("no VmHWM")


def child_memory(url: str, name: str, mode: str, size: int) -> None:
    """In a child process: stream ``size`` bytes of output and report peak RSS."""
    received = 0

    def count(chunk: bytes | str) -> None:
        nonlocal received
        received += len(chunk)

    command = f"yes hermes-sandboxes | head -c {size}"
    baseline = peak_rss_mb()
    started = time.perf_counter()
    if mode == "ours":
        result = backend_for(url).get(name).exec(command, on_stdout=count, timeout=600)
        code = result.exit_code
    else:  # the raw SDK's default handle keeps every chunk
        sdk_sandbox = e2b.Sandbox.connect(backend_for(url).get(name).sandbox_id, api_key=API_KEY,
                                          api_url=url, sandbox_url=url)
        code = sdk_sandbox.commands.run(command, on_stdout=count, timeout=600).exit_code
    peak = peak_rss_mb()
    print(json.dumps({"mode": mode, "bytes": received, "exit_code": code, "seconds": time.perf_counter() - started,
                      "baseline_rss_mb": baseline, "peak_rss_mb": peak, "growth_mb": round(peak - baseline, 1)}))


def memory(url: str, name: str, mode: str, size: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child", url, name, mode, str(size)],
                         capture_output=True, text=True, check=True, timeout=1200)
    data: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    data["seconds"] = round(data["seconds"], 2)
    data["mb_per_s"] = round(data["bytes"] / data["seconds"] / 1e6, 1)
    return data


def file_sync(fake: FakeE2B, backend: E2BBackend, count: int) -> dict[str, Any]:
    sb = backend.get("bench")
    files = {f"/home/user/sync/dir{i % 20}/file{i}.txt": f"content {i}\n".encode() * 20 for i in range(count)}
    fake.clear_requests()
    started = time.perf_counter()
    for path, data in files.items():
        sb.write_file(path, data)
    one_by_one = {"seconds": round(time.perf_counter() - started, 3), "requests": len(fake.requests)}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path, data in files.items():
            info = tarfile.TarInfo(path.removeprefix("/home/user/sync/"))
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    fake.clear_requests()
    started = time.perf_counter()
    sb.write_file("/tmp/sync.tar.gz", buffer.getvalue())
    result = sb.exec("mkdir -p /home/user/sync2 && tar -C /home/user/sync2 -xzf /tmp/sync.tar.gz && "
                     "rm /tmp/sync.tar.gz", timeout=300)
    assert result.exit_code == 0, result.stderr
    batched = {"seconds": round(time.perf_counter() - started, 3), "requests": len(fake.requests)}
    return {"files": count, "write_file_each": one_by_one, "one_tar_upload": batched}


def checkpoints(backend: E2BBackend, rounds: int) -> dict[str, Any]:
    sb = backend.get("bench")
    sb.write_file("/home/user/state.txt", b"v0")
    taken, restored = [], []
    for i in range(rounds):
        started = time.perf_counter()
        ck = sb.checkpoint(f"round {i}")
        taken.append((time.perf_counter() - started) * 1000)
        sb.write_file("/home/user/state.txt", f"v{i + 1}".encode())
        started = time.perf_counter()
        sb.restore(ck.id)
        restored.append((time.perf_counter() - started) * 1000)
        assert sb.read_file("/home/user/state.txt") == b"v0"
    return {"rounds": rounds, "checkpoint_median_ms": round(statistics.median(taken), 1),
            "restore_median_ms": round(statistics.median(restored), 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", nargs=4, metavar=("URL", "NAME", "MODE", "SIZE"))
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--output-bytes", type=int, default=GIB)
    args = parser.parse_args()
    if args.child:
        url, name, mode, size = args.child
        child_memory(url, name, mode, int(size))
        return
    from tests.conftest import make_backend, teardown_backend
    from tests.fakes.e2b import FakeE2B

    local = make_backend(Path(tempfile.mkdtemp(prefix="hse-bench-", dir="/tmp")), image_size="8G")
    try:
        with FakeE2B(local) as fake:
            backend = backend_for(fake.url)
            sb = backend.open("bench")
            raw = e2b.Sandbox.connect(sb.sandbox_id, api_key=API_KEY, api_url=fake.url, sandbox_url=fake.url)
            for _ in range(10):  # warm up both paths
                sb.exec("true")
                raw.commands.run("true")
            ours = median_ms(args.rounds, lambda: sb.exec("true"))
            sdk = median_ms(args.rounds, lambda: raw.commands.run("true"))
            lease = median_ms(args.rounds, lambda: sb.extend_lease(300))
            results: dict[str, Any] = {
                "machine": {"python": platform.python_version(), "cpus": __import__("os").cpu_count()},
                "exec_round_trip": {"ours_median_ms": ours, "raw_sdk_median_ms": sdk,
                                    "ratio": round(ours / sdk, 2), "target_ratio": 1.2,
                                    "lease_extension_median_ms": lease, "rounds": args.rounds},
                "memory_ours": {**memory(fake.url, "bench", "ours", args.output_bytes), "target_growth_mb": 64},
                "memory_raw_sdk_default": memory(fake.url, "bench", "raw", 256 << 20),
                "sync": file_sync(fake, backend, 1000),
                "checkpoints": checkpoints(backend, 5),
            }
            sb.destroy()
    finally:
        teardown_backend(local)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
