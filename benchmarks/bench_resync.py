"""Re-syncing ~/.hermes into a sandbox that already holds it, over the loopback fake E2B, one run.

Run (as root, the fake's sandboxes are local sandboxes): python benchmarks/bench_resync.py [--files N]
Writes benchmarks/results/resync.json and prints a summary.

A Hermes home with N skill files (1,000 by default) is pushed through the Hermes plugin's file sync
(hermes_sandboxes.hermes.sync.filesync) three times:
- the first push into a fresh sandbox: one write per file;
- the full push of a new session resuming that sandbox (what a resume, a take-over or the re-sync after
  a checkpoint restore does): one listing of the sandbox's digests, then writes only for what differs
  (here nothing);
- the same after 10 files changed on the host: 10 writes.
Requests are those the fake received; times are wall clock on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results" / "resync.json"


def push(fake: Any, sync: Any, *, learn: bool) -> dict[str, Any]:
    fake.clear_requests()
    started = time.perf_counter()
    if learn:
        sync.learn_remote()
    sync.push(force=True)
    seconds = time.perf_counter() - started
    return {"seconds": round(seconds, 3), "requests": len(fake.requests),
            "file_writes": len(fake.calls("POST", "/files"))}


def run(files: int) -> dict[str, Any]:
    from hermes_sandboxes.backends.e2b import E2BBackend
    from hermes_sandboxes.backends.e2b.settings import E2BSettings
    from tests.conftest import make_backend, teardown_backend
    from tests.fakes.e2b import API_KEY, FakeE2B

    home = Path(tempfile.mkdtemp(prefix="hsb-resync-", dir="/tmp"))
    (home / "config.yaml").write_text("{}\n")
    for i in range(files):
        path = home / "skills" / f"skill{i % 50}" / f"file{i}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"skill text {i}\n" * 10)
    os.environ["HERMES_HOME"] = str(home)
    from hermes_sandboxes.hermes.sync.filesync import SandboxFileSync

    local = make_backend(home / "store", image_size="4G")
    try:
        with FakeE2B(local) as fake, E2BBackend(E2BSettings(), api_key=API_KEY, profile="/bench/resync",
                                                 api_url=fake.url, sandbox_url=fake.url) as backend:
            sb = backend.open("resync")
            base = f"{sb.home}/.hermes"
            first = push(fake, SandboxFileSync(lambda: sb, base, threading.Lock()), learn=False)
            resumed = push(fake, SandboxFileSync(lambda: sb, base, threading.Lock()), learn=True)
            for i in range(10):
                path = home / "skills" / f"skill{i % 50}" / f"file{i}.md"
                path.write_text(f"changed {i}\n")
            changed = push(fake, SandboxFileSync(lambda: sb, base, threading.Lock()), learn=True)
            sb.destroy()
    finally:
        teardown_backend(local)
        import shutil

        shutil.rmtree(home, ignore_errors=True)
    return {"machine": {"python": platform.python_version(), "cpus": os.cpu_count()}, "files": files,
            "first_push": first, "resume_push_nothing_changed": resumed, "resume_push_10_changed": changed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    results = run(args.files)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
