#!/usr/bin/env bash
# Every benchmark, one after the other, as root; each writes its JSON under benchmarks/results/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
.venv/bin/python benchmarks/bench_local.py "$@"
.venv/bin/python benchmarks/bench_journal.py
.venv/bin/python benchmarks/bench_record.py
.venv/bin/python benchmarks/bench_hermes.py
.venv/bin/python benchmarks/bench_proxy.py
.venv/bin/python benchmarks/bench_e2b.py
.venv/bin/python benchmarks/bench_sprites.py
.venv/bin/python benchmarks/bench_fork.py
.venv/bin/python benchmarks/bench_rootless.py
.venv/bin/python benchmarks/bench_cli.py
.venv/bin/python benchmarks/bench_resync.py
.venv/bin/python benchmarks/bench_mcp.py
.venv/bin/python benchmarks/bench_exec_idle.py --label "$(git rev-parse --abbrev-ref HEAD)"
