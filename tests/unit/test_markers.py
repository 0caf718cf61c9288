"""Every entry of ``tests/markers.py``'s SLOW and QUICK lists names a test that exists: a renamed or
removed test would otherwise leave an entry that selects nothing, silently moving a slow test into
the quick loop (or a kept fast test out of it)."""

from __future__ import annotations

import subprocess
import sys

from tests import markers


def _collected() -> list[str]:
    """The whole suite's node ids, relative to tests/ (as the lists write them)."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                          cwd=markers.TESTS.parent, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return [line.removeprefix("tests/") for line in done.stdout.splitlines() if line.startswith("tests/")]


def test_every_slow_and_quick_entry_names_a_collected_test() -> None:
    nodes = _collected()
    assert len(nodes) > 1000, len(nodes)  # the whole suite, not a stray subset
    unmatched = [entry for entry in (*markers.SLOW, *markers.QUICK)
                 if not any(markers.listed(node.partition("::")[0], node, (entry,)) for node in nodes)]
    assert unmatched == [], unmatched
