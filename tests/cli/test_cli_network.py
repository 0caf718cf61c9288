"""``hermes-sandboxes network``: a running proxy sandbox's allow-list shown and changed from the CLI,
for real (a loopback HTTP server on the host, curl inside, the sandbox's own proxy), without a
restart, and recorded in the sandbox's log and the audit log."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermes_sandboxes.backends.local import LocalBackend, LocalSandbox
from hermes_sandboxes.names import unique_name
from hermes_sandboxes.recorder.journal import AllowRecord, Journal
from hermes_sandboxes.recorder.state import HostState
from hermes_sandboxes.sandbox import SandboxSpec
from tests.cli import cli_kit
from tests.cli.cli_kit import as_json, assert_one_line_error, hs, ok
from tests.local import egress_kit
from tests.local.kit import init_state

home, box = cli_kit.home, cli_kit.box  # the shared fixtures, under the names the tests ask for
CURL = "curl -sS -f -m 10 -o /dev/null -w %{http_code}"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[egress_kit.Server]:
    site = tmp_path_factory.mktemp("site")
    (site / "hello").write_text("hello\n")
    with egress_kit.serve(site, "unused") as running:
        yield running


@pytest.fixture
def proxied(local_backend: LocalBackend) -> Iterator[LocalSandbox]:
    sandbox = local_backend.create(unique_name("net"), SandboxSpec(network="proxy", allow=("@pypi",)))
    try:
        yield sandbox
    finally:
        sandbox.destroy()


def test_allow_deny_and_set_change_a_running_sandbox_s_list_for_its_next_connection(
        home: Path, local_backend: LocalBackend, proxied: LocalSandbox, server: egress_kit.Server) -> None:
    name, entry = proxied.name, f"127.0.0.1:{server.port}"
    fetch = ("exec", name, "--checkpoint", "off", "--", f"{CURL} {server.url}/hello")
    assert hs(home, *fetch).exit_code == 22  # refused by the proxy (403)
    init = init_state(proxied)["pid"]

    added = ok(home, "network", "allow", name, entry, "@pypi")
    assert added.stdout.strip() == f"{name}: network proxy, allowed: @pypi {entry}"
    assert ok(home, *fetch).stdout == "200"
    assert as_json(home, "network", "show", name) == {"name": name, "network": "proxy", "allow": ["@pypi", entry]}

    ok(home, "network", "deny", name, entry)
    assert hs(home, *fetch).exit_code == 22
    ok(home, "network", "set", name, entry)
    assert ok(home, *fetch).stdout == "200"
    assert json.loads(ok(home, "network", "set", name, "--json").stdout)["allow"] == []
    assert hs(home, *fetch).exit_code == 22
    assert init_state(proxied)["pid"] == init  # never restarted
    assert local_backend.get(name).spec.allow == ()  # kept for the sandbox's next start

    changes = Journal(HostState().audit_path(local_backend.key)).records_of(AllowRecord, sandbox=name)
    assert [(c.previous, c.allow) for c in changes] == [
        (("@pypi",), ("@pypi", entry)), (("@pypi", entry), ("@pypi",)), (("@pypi",), (entry,)), ((entry,), ())]
    logged = ok(home, "log", name).stdout
    assert f"allow-list +{entry}" in logged and f"allow-list -{entry}" in logged


def test_bad_changes_are_one_line_errors_that_change_nothing(home: Path, proxied: LocalSandbox,
                                                              box: LocalSandbox) -> None:
    name = proxied.name
    for args, says, code in ((("allow", name, "not a host!"), "Invalid value for 'HOST...': allow entry", 2),
                             (("set", name, "@pypi", "a b"), "allow entry 'a b' is not a host name", 2),
                             (("deny", name, "example.com"), "allow-list has no entry example.com", 1),
                             (("allow", box.name, "pypi.org"), "has network 'none'", 1),
                             (("show", "no-such-sandbox"), "no sandbox named no-such-sandbox", 1)):
        assert_one_line_error(hs(home, "network", *args), exit_code=code, says=says)
    assert as_json(home, "network", "show", name)["allow"] == ["@pypi"]
    assert ok(home, "network", "show", box.name).stdout.strip() == f"{box.name}: network none (no allow-list: " \
                                                                    "nothing is reachable)"


# Imports the CLI (or the Python API), says so, waits for the go file, then changes the list: every
# racer starts its read-modify-write at the same moment instead of one interpreter start-up apart.
_RACER = """
import os, sys, time
from hermes_sandboxes.cli import main
from hermes_sandboxes.backends.local import LocalBackend
from hermes_sandboxes.recorder.state import HostState
print("ready", flush=True)
go, face, home, name, host = sys.argv[1:]
while not os.path.exists(go):
    time.sleep(0.002)
if face == "cli":
    sys.argv = ["hermes-sandboxes", "--home", home, "network", "allow", name, host]
    main()
else:
    HostState().recorded(LocalBackend(home).get(name)).change_allow(add=[host])
"""


def test_simultaneous_allows_of_distinct_hosts_all_land(home: Path, proxied: LocalSandbox, tmp_path: Path) -> None:
    """Twelve processes add one host each at the same moment, through the CLI and the Python API:
    the allow-list lock makes every read-modify-write see the one before it."""
    hosts = [f"h{i}.example.com" for i in range(12)]
    go = tmp_path / "go"
    racers = [subprocess.Popen([sys.executable, "-c", _RACER, str(go), "api" if i % 3 == 0 else "cli", str(home),
                                proxied.name, host], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for i, host in enumerate(hosts)]
    try:
        for p in racers:
            assert p.stdout is not None and p.stdout.readline() == "ready\n", p.communicate()
        go.touch()
        ended = [(p.wait(timeout=120), *p.communicate()) for p in racers]
    finally:
        for p in racers:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(code == 0 for code, _, _ in ended), ended
    assert set(as_json(home, "network", "show", proxied.name)["allow"]) == {"@pypi", *hosts}
    changes = Journal(HostState().audit_path(proxied.backend.key)).records_of(AllowRecord, sandbox=proxied.name)
    assert len(changes) == len(hosts)
    # each change started from the list the one before it left: none was made from a stale read
    for before, after in itertools.pairwise(changes):
        assert after.previous == before.allow, (before, after)
