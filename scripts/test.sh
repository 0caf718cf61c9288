#!/usr/bin/env bash
# The whole test suite, from a fresh machine: set-up, lint, type check, tests. CI runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
echo "== ruff (seconds)" >&2
.venv/bin/ruff check src tests benchmarks
echo "== mypy --strict (src, tests, benchmarks; about a minute, less with its cache)" >&2
.venv/bin/mypy
echo "== mypy --strict, without the optional extras (hermes, sprites, e2b)" >&2
stamp=".venv-min/.installed-$(sha1sum pyproject.toml | cut -c1-12)"
if [ ! -e "$stamp" ]; then
  "${PYTHON:-python3}" -m venv .venv-min
  .venv-min/bin/python -m pip install -q --disable-pip-version-check -e . mypy types-PyYAML
  touch "$stamp"
fi
.venv-min/bin/mypy src  # the tests need the extras; the package must type-check without them
echo "== pytest: the whole suite, about 12 minutes on a quiet 2-vCPU machine (two to three times that" \
     "under load); a dot per test, the QEMU guest's cgroup v2 tests among them" >&2
exec .venv/bin/python -m pytest -q "$@"
