#!/usr/bin/env bash
# The whole test suite, from a fresh machine: set-up, lint, type check, tests. CI runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
echo "== ruff" >&2
.venv/bin/ruff check src tests benchmarks
echo "== mypy --strict" >&2
.venv/bin/mypy
echo "== pytest" >&2
exec .venv/bin/python -m pytest -q "$@"
