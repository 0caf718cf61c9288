"""The local benchmark runs end to end and writes its JSON (its numbers are not asserted: the
machines are noisy; the benchmark itself reports whether the targets were met)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_local.py"


@pytest.fixture
def scratch() -> Iterator[Path]:
    """The benchmark's own temporary directory (TMPDIR), so that what it leaves behind is checked
    there, not among other runs' stores in /tmp (another run of the same benchmark would fail the
    check); short, for the sockets under it."""
    where = Path(tempfile.mkdtemp(prefix="hb-", dir="/tmp"))
    yield where
    shutil.rmtree(where, ignore_errors=True)


def _env(scratch: Path) -> dict[str, str]:
    return {**os.environ, "TMPDIR": str(scratch)}


def test_the_local_benchmark_runs_in_quick_mode_and_writes_every_measure(tmp_path: Path) -> None:
    out = tmp_path / "local.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    # 0: every target met, 1: a target missed on this machine now (a measurement, not a failure); a crash
    # shows as a traceback, and any other code is a failure
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr and out.exists(), proc.stderr
    report = json.loads(out.read_text())
    results = report["results"]
    assert results["concurrent"]["succeeded"] == 20, results["concurrent"]["errors"]
    assert set(results["layers"]) == {"1MB", "100MB"}
    for layer in results["layers"].values():
        assert layer["diff_entries"] > 0 and layer["checkpoint_p50_ms"] > 0
    assert set(results["quota"]) == {"1MB", "100MB"}
    for quota in results["quota"].values():  # limited and unlimited, interleaved in the same run
        assert quota["restore_incl_restart_p50_ms"] > 0 and quota["no_limit_restore_incl_restart_p50_ms"] > 0
        assert quota["restore_p50_ratio"] > 0 and min(quota["samples"].values()) >= 5
    assert set(report["meets_targets"]) >= {"exec_p50_ms", "checkpoint_p50_ms", "restore_incl_restart_ms",
                                            "create_ms", "idle_memory_mb", "diff_ms"}
    assert "| exec round trip" in proc.stdout
    assert not Path(report["home"]).exists(), "the benchmark left its store behind"  # its own only:
    # other test runs on the machine may be running the same benchmark meanwhile


PROXY_BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_proxy.py"


def test_the_proxy_benchmark_runs_in_quick_mode_and_writes_both_measures(tmp_path: Path, scratch: Path) -> None:
    out = tmp_path / "proxy.json"
    proc = subprocess.run([sys.executable, str(PROXY_BENCH), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, env=_env(scratch))
    # 0: every target met, 1: a target missed on this machine now (a measurement, not a failure); a crash
    # shows as a traceback, and any other code is a failure
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr and out.exists(), proc.stderr
    results = json.loads(out.read_text())["results"]
    assert results["download"]["host_mb_s"] > 0 and results["download"]["proxy_mb_s"] > 0
    assert results["https_small"]["samples"] == 20 and results["https_small"]["proxy_brokered_p50_ms"] > 0
    assert results["relay_design"]["threads_mb_s"] > 0 and results["proxy_rss_mb"]["brokering"] > 0
    assert "| download 20 MB, proxy" in proc.stdout
    assert not list(scratch.iterdir()), "the benchmark left its stores behind"


def test_the_cli_benchmark_runs_and_writes_its_ratio(tmp_path: Path, scratch: Path) -> None:
    out = tmp_path / "cli.json"
    bench = BENCH.parent / "bench_cli.py"
    proc = subprocess.run([sys.executable, str(bench), "--runs", "3", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, env=_env(scratch))
    # 0: every target met, 1: a target missed on this machine now (a measurement, not a failure); a crash
    # shows as a traceback, and any other code is a failure
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr and out.exists(), proc.stderr
    report = json.loads(out.read_text())
    results = report["results"]
    assert results["ratio_warm"] > 0 and results["ratio_in_process"] > 0, results
    assert results["cli_exec_true_warm"]["runs"] == 3 and results["cli_exec_true_in_process"]["runs"] == 3
    assert results["cli_exec_true_first_starting_the_server"]["runs"] >= 1
    assert results["server_memory"]["rss_kib"] > 0 and results["server_pid_answer"]["median_ms"] > 0
    assert "| CLI `exec NAME -- true`, warm server" in proc.stdout
    assert not list(scratch.iterdir()), "the benchmark left its store behind"
    assert not [p for p in Path("/proc").glob("[0-9]*/cmdline")
                if SERVER in _reads(p) and str(tmp_path).encode() in _reads(p.parent / "environ")]


SERVER = b"hermes_sandboxes.cli.fastpath.server"  # the warm exec server's module, in its command line


def _reads(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def test_the_record_benchmark_runs_and_writes_the_overhead_of_recording(tmp_path: Path, scratch: Path) -> None:
    out = tmp_path / "record.json"
    bench = BENCH.parent / "bench_record.py"
    proc = subprocess.run([sys.executable, str(bench), "--runs", "5", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, env=_env(scratch))
    # 0: every target met, 1: a target missed on this machine now (a measurement, not a failure); a crash
    # shows as a traceback, and any other code is a failure
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr and out.exists(), proc.stderr
    results = json.loads(out.read_text())["results"]
    assert {"bare_exec", "recorded_fsync", "recorded_no_fsync"} <= set(results)
    assert results["recorded_fsync"]["runs"] == 5 and "overhead_ms" in results["recorded_no_fsync"]
    assert not list(scratch.iterdir()), "the benchmark left its store behind"


ROOTLESS_BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_rootless.py"


def test_the_rootless_benchmark_runs_in_quick_mode_and_writes_both_modes(tmp_path: Path, scratch: Path) -> None:
    out = tmp_path / "rootless.json"
    users_before = _bench_users()
    proc = subprocess.run([sys.executable, str(ROOTLESS_BENCH), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=900, env=_env(scratch))
    # 0: every target met, 1: a target missed on this machine now (a measurement, not a failure); a crash
    # shows as a traceback, and any other code is a failure
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr and out.exists(), proc.stderr
    report = json.loads(out.read_text())
    rootless, root = report["rootless"], report["root"]
    assert rootless["btrfs"]["store"] == "subvolume" and rootless["ext4"]["store"] == "overlay"
    assert rootless["btrfs"]["snapshots"]["1MB"]["checkpoint_p50_ms"] > 0
    assert root["btrfs_snapshots"]["1MB"]["restore_p50_ms"] > 0
    assert rootless["ext4"]["changed"]["1MB"]["ratio"] > 0 and root["copy_changed"]["1MB"]["checkpoint_p50_ms"] > 0
    assert "exec_p50_ms" in root["exec"] and "exec_p50_ms" in rootless["btrfs"]["exec"], rootless["btrfs"]["exec"]
    assert "| 1MB |" in proc.stdout
    assert not list(scratch.iterdir()), "the benchmark left its stores behind"
    assert _bench_users() <= users_before, "the benchmark left its test user behind"


def _bench_users() -> set[str]:
    return {line.split(":")[0] for line in Path("/etc/passwd").read_text().splitlines()
            if line.startswith("hs-rootstore-bench-")}


RESTORE_BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_restore.py"


def test_the_restore_benchmark_runs_and_writes_the_cli_overhead(tmp_path: Path, scratch: Path) -> None:
    out = tmp_path / "restore.json"
    proc = subprocess.run([sys.executable, str(RESTORE_BENCH), "--runs", "2", "--history", "10", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, env=_env(scratch))
    # 0: every target met, 1: a target missed here now (a measurement); a crash is a traceback
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr and out.exists(), proc.stderr
    results = json.loads(out.read_text())["results"]
    assert results["cli_restore_p50_ms"] > 0 and results["backend_restore_p50_ms"] > 0
    assert "| CLI `checkpoint restore --yes`" in proc.stdout
    assert list(scratch.iterdir()) == [], "the benchmark left its store behind"


HOSTILE_BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_hostile.py"


def test_the_hostile_tree_benchmark_runs_and_writes_diff_preview_and_restore_rows(
        tmp_path: Path, scratch: Path) -> None:
    out = tmp_path / "hostile.json"
    proc = subprocess.run([sys.executable, str(HOSTILE_BENCH), "--depth", "60", "--files", "700", "--runs-deep", "2",
                           "--out", str(out)], capture_output=True, text=True, timeout=600, env=_env(scratch))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr and out.exists(), proc.stderr  # no target to miss
    results = json.loads(out.read_text())["results"]
    deep, flat = results["deep_60"], results["flat_700"]
    assert len(deep["runs"]) == 2 and len(flat["runs"]) == 1
    assert deep["runs"][0]["changes"] == deep["runs"][0]["preview_files"] == 61  # /opt/hs-bench and 60 levels
    assert flat["runs"][0]["changes"] == 702  # 700 files, their directory and /opt/hs-bench
    assert set(deep["median"]) == {"diff_s", "diff_traced_s", "diff_peak_mb", "preview_s", "restore_yes_s"}
    assert "| deep_60 (btrfs) | 2 |" in proc.stdout and "| flat_700 (btrfs) | 1 |" in proc.stdout  # (the store named)
    assert list(scratch.iterdir()) == [], "the benchmark left its store behind"


AB_BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_ab.py"


def test_the_ab_benchmark_runs_two_trees_interleaved_and_writes_every_ratio(tmp_path: Path, scratch: Path) -> None:
    out = tmp_path / "ab.json"
    src = AB_BENCH.parents[1] / "src"  # this tree against itself: the run, not the figures, is checked
    proc = subprocess.run([sys.executable, str(AB_BENCH), "--a", str(src), "--b", str(src), "--samples", "2",
                           "--creates", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, env=_env(scratch))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr and out.exists(), proc.stderr
    row = json.loads(out.read_text())
    for op in ("restore", "first_exec", "exec", "checkpoint", "create_exec_destroy", "cli_warm_exec", "hermes"):
        for measure in (op, f"{op}_host_cpu"):
            assert row[measure]["a_p50_ms"] > 0 and row[measure]["b_p50_ms"] > 0, measure
    assert row["restore"]["n"] == 2 and row["create_exec_destroy"]["n"] == 1
    assert "| restore |" in proc.stdout and "| cli_warm_exec |" in proc.stdout and "| hermes |" in proc.stdout
    assert list(scratch.iterdir()) == [], "the benchmark left its stores behind"
