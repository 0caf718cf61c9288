"""Output that tells the truth (issue #22, points 8, 10, 11): ``doctor`` changes nothing, a reused
checkpoint is not said to be taken, forks are in both sandboxes' trails, one text per refusal."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from hermes_sandboxes.backends.local import LocalBackend, LocalSandbox
from hermes_sandboxes.cli import cli
from hermes_sandboxes.names import unique_name
from hermes_sandboxes.sandbox import SandboxSpec
from tests.cli import cli_kit
from tests.cli.cli_kit import as_json, hs, ok
from tests.local import egress_kit

home, box = cli_kit.home, cli_kit.box


def test_doctor_on_a_new_home_reports_the_store_it_would_create_and_creates_nothing() -> None:
    home = Path(tempfile.mkdtemp(prefix="hsb-doctor-", dir="/tmp")) / "new-home"
    try:
        result = CliRunner().invoke(cli, ["--home", str(home), "doctor", "--json"])
        assert result.exit_code == 0, (result.stdout, result.stderr)
        [store] = [c for c in json.loads(result.stdout)["checks"] if c["label"] == "sandbox store"]
        assert store["ok"] and store["detail"].startswith(f"none yet at {home}: the first sandbox creates"), store
        assert not home.exists() or not any(home.iterdir()), list(home.iterdir())
        assert str(home) not in Path("/proc/self/mounts").read_text()  # nothing mounted either
        table = CliRunner().invoke(cli, ["--home", str(home), "doctor"])
        assert table.exit_code == 0 and "none yet at" in table.stdout, table.stdout
        assert not home.exists() or not any(home.iterdir())
    finally:
        if home.exists():
            home.rmdir()
        home.parent.rmdir()


def test_a_fork_is_in_both_sandboxes_trails(home: Path, box: LocalSandbox) -> None:
    taken = ok(home, "checkpoint", "create", box.name).stdout.strip()
    new, now = unique_name("forked"), unique_name("forked")
    try:
        ok(home, "fork", box.name, taken, new)
        ok(home, "fork", box.name, now)
        source = ok(home, "log", box.name).stdout
        assert f"forked into {new} from {taken}" in source and f"forked into {now} as it was" in source, source
        assert f"forked from {box.name}@{taken}" in ok(home, "log", new).stdout
        assert f"forked from {box.name}" in ok(home, "log", now).stdout
        forks = [r for r in as_json(home, "log", box.name) if r["type"] == "fork"]
        assert [(f["to"], f["checkpoint"]) for f in forks] == [(new, taken), (now, None)], forks
    finally:
        hs(home, "rm", new, "--yes")
        hs(home, "rm", now, "--yes")


def test_log_says_who_deleted_a_checkpoint_and_what_it_was(home: Path, box: LocalSandbox) -> None:
    ok(home, "exec", box.name, "--", "rm -rf /root/nothing")  # an automatic checkpoint first
    [auto] = as_json(home, "checkpoint", "list", box.name)
    assert auto["trigger"] == "auto", auto
    ok(home, "checkpoint", "rm", box.name, auto["id"], "--yes")
    logged = ok(home, "log", box.name).stdout
    assert f"{auto['id']} [auto] deleted by hand (checkpoint rm)" in logged, logged
    assert "(manual)" not in logged, logged


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[egress_kit.Server]:
    site = tmp_path_factory.mktemp("site")
    (site / "hello").write_text("hello\n")
    with egress_kit.serve(site, "unused") as running:
        yield running


def test_log_says_an_egress_refusal_once(home: Path, local_backend: LocalBackend, server: egress_kit.Server) -> None:
    sandbox = local_backend.create(unique_name("net"), SandboxSpec(network="proxy", allow=("@pypi",)))
    try:
        fetch = f"curl -sS -f -m 10 -o /dev/null {server.url}/hello"
        assert hs(home, "exec", sandbox.name, "--checkpoint", "off", "--", fetch).exit_code == 22
        [row] = [line for line in ok(home, "log", sandbox.name).stdout.splitlines() if " egress " in line]
        target = f"127.0.0.1:{server.port}"
        assert row.count(target) == 1 and row.count("refused") == 1, row
        assert "no allow-list entry names this address and port" in row, row
    finally:
        sandbox.destroy()


def test_the_same_risky_command_again_says_its_checkpoint_is_kept_not_taken(home: Path, box: LocalSandbox) -> None:
    first = ok(home, "exec", box.name, "--", "rm -rf /root/build").stderr
    assert "taken first (recursive rm of /root/build)" in first, first
    again = ok(home, "exec", box.name, "--", "rm -rf /root/build").stderr  # nothing changed in between
    assert "kept as the undo point, nothing changed since" in again and "taken first" not in again, again
    [checkpoint] = as_json(home, "checkpoint", "list", box.name)
    assert checkpoint["id"] in first and checkpoint["id"] in again
