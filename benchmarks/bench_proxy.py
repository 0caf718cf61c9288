"""Benchmarks of network mode ``proxy`` against ``host``, measured in one run (issue 13's targets).

Run as root: ``.venv/bin/python benchmarks/bench_proxy.py [--quick] [--out FILE]``. It builds
throw-away stores under /tmp and servers on the host's loopback (``python3 -m http.server`` for the
download, a small HTTPS server with a self-signed certificate), and removes everything at the end.
Writes JSON (default benchmarks/results/proxy.json) and prints a Markdown table.

- throughput: one large download with curl inside a ``host`` sandbox and inside a ``proxy`` sandbox,
  alternated, median of the rounds; target: proxy >= 0.8x host.
- latency: curl's own time for a small HTTPS request, median over many; ``proxy`` through a plain
  CONNECT tunnel, and with credential brokering (TLS terminated and re-established by the proxy);
  target: <= 5 ms added at the median for the tunnel.
- relay design: the same bulk copy (TCP in, TCP out, 256 KiB reads) done by a thread per
  connection, as the proxy does, and by asyncio streams, in one process: why the proxy uses threads.
- the proxy process's resident memory, without and with credential brokering (which loads
  ``cryptography``).
No number here is asserted by the test suite: these machines are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from hermes_sandboxes.backends.local import LocalBackend, LocalSandbox
from hermes_sandboxes.egress.broker import BrokeredCredential
from hermes_sandboxes.sandbox import SandboxSpec

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from tests.local import egress_kit  # noqa: E402  (the tests' loopback servers and certificate)

TARGETS = {"throughput_ratio": 0.8, "added_latency_p50_ms": 5.0}
CURL_TIME = "curl -sS -f -o /dev/null -w '%{time_total}\\n'"


def _curl_seconds(sb: LocalSandbox, args: str, count: int = 1) -> list[float]:
    script = f"for i in $(seq {count}); do {CURL_TIME} {args}; done"
    result = sb.exec(script, timeout=600)
    if result.exit_code != 0:
        raise RuntimeError(f"curl failed in {sb.name}: {result.stderr.strip()}")
    return [float(line) for line in result.stdout.split()]


def throughput(host: LocalSandbox, proxy: LocalSandbox, port: int, size: int, rounds: int) -> dict[str, Any]:
    host_s, proxy_s = [], []
    url = f"http://127.0.0.1:{port}/big"
    for _ in range(rounds):  # alternated, so both see the same machine load
        host_s += _curl_seconds(host, url)
        proxy_s += _curl_seconds(proxy, url)
    host_mb = size / statistics.median(host_s) / 1e6
    proxy_mb = size / statistics.median(proxy_s) / 1e6
    return {"bytes": size, "rounds": rounds, "host_mb_s": round(host_mb, 1), "proxy_mb_s": round(proxy_mb, 1),
            "ratio": round(proxy_mb / host_mb, 3)}


def latency(sandboxes: dict[str, LocalSandbox], url: str, samples: int) -> dict[str, Any]:
    medians = {}
    for label, sb in sandboxes.items():
        # Each curl trusts exactly one CA (the upstream's, or with brokering the proxy's), so the
        # figures compare the network paths; loading a full system bundle costs OpenSSL 3 some
        # milliseconds per process on its own, in every mode alike.
        ca = "/dev/hermes-egress/ca.pem" if label == "proxy_brokered" else "/root/upstream.pem"
        args = f"--cacert {ca} {url}"
        _curl_seconds(sb, args, 3)  # warm: leaf certificate, caches
        times = _curl_seconds(sb, args, samples)
        medians[label] = statistics.median(times) * 1000
    out = {f"{label}_p50_ms": round(ms, 2) for label, ms in medians.items()}
    out["added_tunnel_p50_ms"] = round(medians["proxy_tunnel"] - medians["host"], 2)
    out["added_brokered_p50_ms"] = round(medians["proxy_brokered"] - medians["host"], 2)
    out["samples"] = samples
    return out


_CHUNK = 256 * 1024


def _source(size: int) -> int:
    """A TCP server that sends ``size`` bytes to each connection."""
    listener = socket.create_server(("127.0.0.1", 0))

    def send(conn: socket.socket) -> None:
        with conn:
            block, left = b"x" * _CHUNK, size
            while left > 0:
                conn.sendall(block[:min(left, _CHUNK)])
                left -= _CHUNK

    def serve() -> None:
        while True:
            threading.Thread(target=send, args=(listener.accept()[0],), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return int(listener.getsockname()[1])


def _threaded_relay(upstream: int) -> int:
    listener = socket.create_server(("127.0.0.1", 0))

    def pump(conn: socket.socket) -> None:
        with conn, socket.create_connection(("127.0.0.1", upstream)) as up:
            buf = bytearray(_CHUNK)
            view = memoryview(buf)
            while n := up.recv_into(buf):
                conn.sendall(view[:n])

    def serve() -> None:
        while True:
            threading.Thread(target=pump, args=(listener.accept()[0],), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return int(listener.getsockname()[1])


def _asyncio_relay(upstream: int) -> int:
    ready, ports = threading.Event(), []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream, limit=_CHUNK)
        while data := await up_reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
        writer.close()
        up_writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, limit=_CHUNK)
        ports.append(server.sockets[0].getsockname()[1])
        ready.set()
        await server.serve_forever()

    threading.Thread(target=lambda: asyncio.run(main()), daemon=True).start()
    ready.wait(10)
    return int(ports[0])


def _fetch_mb_s(port: int, size: int) -> float:
    started = time.perf_counter()
    total, buf = 0, bytearray(_CHUNK)
    with socket.create_connection(("127.0.0.1", port)) as conn:
        while n := conn.recv_into(buf):
            total += n
    assert total == size
    return size / (time.perf_counter() - started) / 1e6


def relay_design(size: int, rounds: int) -> dict[str, Any]:
    source = _source(size)
    ports = {"direct": source, "threads": _threaded_relay(source), "asyncio": _asyncio_relay(source)}
    samples: dict[str, list[float]] = {label: [] for label in ports}
    for _ in range(rounds):
        for label, port in ports.items():
            samples[label].append(_fetch_mb_s(port, size))
    return {f"{label}_mb_s": round(statistics.median(values), 1) for label, values in samples.items()}


def proxy_rss_mb(sb: LocalSandbox) -> float:
    state = json.loads((sb.backend.layout.run_dir(sb.name) / "init.json").read_text())
    with open(f"/proc/{state['egress']['pid']}/status") as f:
        rss_kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return round(rss_kb / 1024, 1)


def run(quick: bool, work: Path) -> dict[str, Any]:
    size = (20 if quick else 200) << 20
    site = work / "site"
    site.mkdir()
    with open(site / "big", "wb") as f:
        f.write(os.urandom(1 << 20) * (size >> 20))
    (site / "small").write_bytes(b"x" * 512)
    cert = egress_kit.self_signed(work)
    os.environ["HSB_BENCH_TOKEN"] = "bench-secret"
    credential = BrokeredCredential(name="BENCH_TOKEN", env="HSB_BENCH_TOKEN", hosts=("127.0.0.1:*",))
    plain = LocalBackend(work / "plain", store="copy")
    brokering = LocalBackend(work / "brokering", store="copy", credentials=[credential], upstream_ca=str(cert[0]))
    sandboxes: list[LocalSandbox] = []
    try:
        with egress_kit.http_server_process(site) as port, egress_kit.serve(site, "unused", tls=cert) as tls_server:
            allow = (f"127.0.0.1:{port}", f"127.0.0.1:{tls_server.port}")
            host = plain.create("bench-host", SandboxSpec(network="host"))
            tunnel = plain.create("bench-proxy", SandboxSpec(network="proxy", allow=allow))
            brokered = brokering.create("bench-brokered", SandboxSpec(network="proxy", allow=allow))
            sandboxes += [host, tunnel, brokered]
            for sb in sandboxes:
                sb.write_file("/root/upstream.pem", cert[0].read_bytes())
            print("throughput...", file=sys.stderr)
            results = {"download": throughput(host, tunnel, port, size, 3 if quick else 5)}
            print("latency...", file=sys.stderr)
            results["https_small"] = latency({"host": host, "proxy_tunnel": tunnel, "proxy_brokered": brokered},
                                             f"{tls_server.url}/small", 20 if quick else 100)
            results["proxy_rss_mb"] = {"tunnel": proxy_rss_mb(tunnel), "brokering": proxy_rss_mb(brokered)}
        print("relay design...", file=sys.stderr)
        results["relay_design"] = relay_design(size, 3 if quick else 5)
        return results
    finally:
        for sb in sandboxes:
            sb.destroy()
        os.environ.pop("HSB_BENCH_TOKEN", None)


def table(results: dict[str, Any]) -> str:
    d, lat = results["download"], results["https_small"]
    rows = [
        f"| download {d['bytes'] >> 20} MB, host | {d['host_mb_s']} MB/s | |",
        f"| download {d['bytes'] >> 20} MB, proxy | {d['proxy_mb_s']} MB/s | ratio {d['ratio']} (target >= 0.8) |",
        f"| small HTTPS request, host | {lat['host_p50_ms']} ms | |",
        f"| small HTTPS request, proxy tunnel | {lat['proxy_tunnel_p50_ms']} ms | "
        f"+{lat['added_tunnel_p50_ms']} ms (target <= 5) |",
        f"| small HTTPS request, proxy brokering | {lat['proxy_brokered_p50_ms']} ms | "
        f"+{lat['added_brokered_p50_ms']} ms |",
        f"| proxy process RSS, tunnel / brokering | {results['proxy_rss_mb']['tunnel']} / "
        f"{results['proxy_rss_mb']['brokering']} MB | |",
        f"| bulk relay in-process: direct / threads / asyncio | {results['relay_design']['direct_mb_s']} / "
        f"{results['relay_design']['threads_mb_s']} / {results['relay_design']['asyncio_mb_s']} MB/s | |",
    ]
    return "| measure | median | note |\n|---|---|---|\n" + "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 MB and fewer samples (for the test suite)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "proxy.json")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_proxy: must run as root (the local sandbox needs it)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="hsb-proxy-"))
    try:
        results = run(args.quick, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    meets = {"throughput_ratio": results["download"]["ratio"] >= TARGETS["throughput_ratio"],
             "added_latency_p50_ms": results["https_small"]["added_tunnel_p50_ms"] <= TARGETS["added_latency_p50_ms"]}
    report = {"benchmark": "proxy", "quick": args.quick, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version()},
              "targets": TARGETS, "results": results, "meets_targets": meets}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(results))
    print(f"\nwritten to {args.out}; targets met: {meets}")
    return 0 if all(meets.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
