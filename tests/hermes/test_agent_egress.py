"""The real Hermes agent loop with network ``proxy``: the model's ``pip install`` reaches a local
package index through the sandbox's egress proxy, set up from the plugin's settings alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from hermes_sandboxes.recorder.journal import AllowRecord, Journal
from hermes_sandboxes.recorder.state import HostState
from tests.cli.cli_kit import hs
from tests.fakes.model_server import call, say
from tests.local import egress_kit

if TYPE_CHECKING:
    from tests.hermes.conftest import HermesHarness
    from tests.hermes.loop_kit import AgentLoop

HERMES_BIN = Path(sys.executable).parent / "hermes"


@pytest.fixture(scope="module")
def index_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    with egress_kit.http_server_process(egress_kit.build_site(tmp_path_factory.mktemp("site"))) as port:
        yield port


def test_the_agent_pip_installs_from_an_allowed_index_and_nothing_else(agent_loop: AgentLoop,
                                                                       index_port: int) -> None:
    agent_loop.settings.update(network="proxy", allow=[f"127.0.0.1:{index_port}"])
    index = f"http://127.0.0.1:{index_port}/simple/"
    run = agent_loop.ask([
        call("terminal", command=f"python3 -m pip install --no-deps --disable-pip-version-check "
                                 f"--break-system-packages --index-url {index} --trusted-host 127.0.0.1 hsbdemo "
                                 "&& python3 -c 'import hsbdemo; print(\"value\", hsbdemo.VALUE)'"),
        call("terminal", command=f"curl -sS -f -m 10 -o /dev/null http://127.0.0.1:{index_port + 1}/ ; "
                                 "python3 -c 'import socket; socket.create_connection((\"192.0.2.1\", 80), 3)'"),
        say("installed"),
    ])
    installed, elsewhere = run.tool_json()
    assert installed["exit_code"] == 0 and "value 42" in installed["output"], installed
    assert elsewhere["exit_code"] != 0 and "403" in elsewhere["output"], elsewhere  # the proxy said no
    assert "Network is unreachable" in elsewhere["output"]  # and there is no way around it
    # installed in the sandbox's layer, not on the host's disk
    assert not list(Path("/usr/local/lib").glob("python3*/dist-packages/hsbdemo"))


def test_hermes_sandbox_network_changes_the_profile_s_sandbox_for_its_next_connection(
        hermes: HermesHarness, index_port: int) -> None:
    hermes.configure(network="proxy", allow=["@pypi"])
    entry = f"127.0.0.1:{index_port}"
    fetch = f"curl -sS -f -m 10 -o /dev/null -w '%{{http_code}}' http://{entry}/simple/hsbdemo/"
    assert hermes.run(fetch)["exit_code"] == 22  # the proxy refuses: not on the list

    def network(*words: str, code: int = 0) -> str:
        done = subprocess.run([str(HERMES_BIN), "sandbox", "network", *words], capture_output=True, text=True,
                              env={**os.environ, "HERMES_HOME": str(hermes.home)}, timeout=120, check=False)
        assert done.returncode == code, done.stdout + done.stderr
        return done.stdout if code == 0 else done.stderr  # errors go to stderr, one line

    name = hermes.env().sandbox_name
    assert json.loads(network("allow", entry, "--json")) == {"sandbox": name, "network": "proxy",
                                                             "allow": ["@pypi", entry]}
    assert hermes.run(fetch)["output"] == "200"  # the same session, no restart
    # text by default: the line hermes-sandboxes network prints
    assert network("deny", entry) == f"{name}: network proxy, allowed: @pypi\n"
    assert hermes.run(fetch)["exit_code"] == 22
    # an entry the list does not hold: an error (exit 1), one line, as hermes-sandboxes network deny says it
    refusal = network("deny", "example.com", code=1)
    assert refusal.startswith("error: ") and "no entry example.com" in refusal, refusal
    assert hs(hermes.backend.home, "network", "deny", name, "example.com").exit_code == 1
    assert json.loads(network("show", "--json"))["allow"] == ["@pypi"]


def test_a_resumed_sandbox_takes_a_changed_allow_setting_but_keeps_a_change_made_from_the_shell(
        agent_loop: AgentLoop, index_port: int) -> None:
    """Each ``hermes chat -q`` is a new session resuming the profile's sandbox. An edited setting is
    applied (the live list is the one the plugin gave it); a list changed from the shell is kept and
    the session is warned once; once the two agree again, the next edit of the setting applies."""
    entry = f"127.0.0.1:{index_port}"
    fetch = f"curl -sS -m 10 -o /dev/null -w '%{{http_code}}' http://{entry}/simple/hsbdemo/"

    def session() -> dict[str, Any]:
        (result,) = agent_loop.ask([call("terminal", command=fetch), say("done")]).tool_json()
        return result

    agent_loop.settings.update(network="proxy", allow=["@pypi"])
    first = session()
    assert first["output"].startswith("403"), first  # created with the setting's list
    name = agent_loop.sandbox().name

    agent_loop.settings["allow"] = ["@pypi", entry]
    edited = session()
    assert edited["output"].startswith("200"), edited
    assert "the allow setting changed" in edited["output"] and f"now @pypi {entry}" in edited["output"]
    changes = Journal(HostState().audit_path(agent_loop.backend.key)).records_of(AllowRecord, sandbox=name)
    assert [(c.previous, c.allow) for c in changes] == [(("@pypi",), ("@pypi", entry))]

    done = subprocess.run([sys.executable, "-m", "hermes_sandboxes.cli", "--home", str(agent_loop.backend.home),
                           "network", "deny", name, entry], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    kept = session()
    assert kept["output"].startswith("403"), kept  # the shell's change holds
    assert "was changed outside this plugin's settings and is kept" in kept["output"], kept
    assert f"network set @pypi {entry} --sandbox {name}" in kept["output"]
    again = session()
    assert again["output"].startswith("403") and "[sandbox:" not in again["output"], again  # warned once
    assert agent_loop.sandbox().info().spec.allow == ("@pypi",)

    agent_loop.settings["allow"] = ["@pypi"]  # the setting takes the shell's change on board
    assert session()["output"] == "403"
    agent_loop.settings["allow"] = ["@pypi", entry]  # and its next edit applies again
    assert session()["output"].startswith("200")
