"""The CLI hides the agent framework's own housekeeping by default and shows it with --all: in
``log`` and ``checkpoint show`` (the commands) and ``checkpoint diff`` (Hermes's scratch files)."""

from __future__ import annotations

from pathlib import Path

from hermes_sandboxes.backends.local import LocalSandbox
from tests.cli import cli_kit
from tests.cli.cli_kit import as_json, ok

KERNEL = "/tmp/hermes_rkernel_0badc0ffee00"
home, box = cli_kit.home, cli_kit.box  # the shared fixtures, under the names the tests ask for
HOUSEKEEPING = f"rm -f {KERNEL}/rpc/req_* {KERNEL}/rpc/res_*"  # as Hermes sends it for execute_code
SCRATCH = f"mkdir -p {KERNEL}/rpc && touch {KERNEL}/rpc/req_000001"  # as Hermes's kernel runner would


def test_housekeeping_is_hidden_from_log_and_show_unless_all(home: Path, box: LocalSandbox) -> None:
    first = ok(home, "checkpoint", "create", box.name).stdout.strip()
    ok(home, "exec", box.name, "--", HOUSEKEEPING)
    ok(home, "exec", box.name, "--", "echo the agents own")
    second = ok(home, "checkpoint", "create", box.name).stdout.strip()

    told = [r.get("command") for r in as_json(home, "log", box.name) if r["type"] == "exec"]
    everything = [r.get("command") for r in as_json(home, "log", box.name, "--all") if r["type"] == "exec"]
    assert told == ["echo the agents own"] and everything == [HOUSEKEEPING, "echo the agents own"]
    assert HOUSEKEEPING not in ok(home, "log", box.name).stdout
    assert HOUSEKEEPING[:40] in ok(home, "log", box.name, "--all").stdout

    assert HOUSEKEEPING[:40] not in ok(home, "checkpoint", "show", box.name, second).stdout
    assert HOUSEKEEPING[:40] in ok(home, "checkpoint", "show", box.name, second, "--all").stdout
    assert first != second


def test_hermess_scratch_files_are_left_out_of_a_diff_unless_all(home: Path, box: LocalSandbox) -> None:
    taken = ok(home, "checkpoint", "create", box.name).stdout.strip()
    ok(home, "exec", box.name, "--checkpoint", "off", "--", f"{SCRATCH} && echo app > /root/app.txt")
    shown = ok(home, "checkpoint", "diff", box.name, taken, "--full").stdout
    assert "/root/app.txt" in shown and "hermes_rkernel" not in shown
    everything = ok(home, "checkpoint", "diff", box.name, taken, "--full", "--all").stdout
    assert f"{KERNEL}/rpc/req_000001" in everything
