"""The Sprites benchmark runs end to end over the fake and writes its JSON (its numbers are not
asserted here: the machines are noisy; the benchmark reports whether its targets were met)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_sprites.py"


def test_the_sprites_benchmark_runs_in_quick_mode_and_cleans_up(tmp_path: Path) -> None:
    out = tmp_path / "sprites.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert out.exists(), proc.stderr[-3000:]
    report = json.loads(out.read_text())
    results = report["results"]
    assert results["sync"]["requests"] == results["sync"]["files"] == 100
    assert results["exec"]["ours_ms"] > 0 and results["memory"]["printed_mb"] == 128
    assert set(report["meets_targets"]) == {"exec_overhead", "print_1gb_memory", "sync_one_request_per_file"}
    assert "| exec round trip" in proc.stdout
    assert not Path(report["fake_home"]).exists(), "the fake server left its store behind"
