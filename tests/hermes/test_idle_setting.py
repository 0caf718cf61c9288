"""The plugin's ``idle_timeout`` setting through a real Hermes: the sandbox stops when idle, its files
stay, and the agent's next command finds it started again, the stop in its journal."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from hermes_sandboxes.recorder.records import StopRecord

if TYPE_CHECKING:
    from tests.hermes.conftest import HermesHarness


def test_an_idle_sandbox_is_stopped_and_the_next_command_starts_it(hermes: HermesHarness) -> None:
    hermes.configure(idle_timeout="2s")
    assert hermes.run("echo kept > /root/f && (setsid sleep 1006 >/dev/null 2>&1 &)")["exit_code"] == 0
    env = hermes.env()
    sandbox = env.sandbox
    assert sandbox.info().spec.idle_timeout == 2.0
    deadline = time.monotonic() + 60
    while sandbox.is_running():
        assert time.monotonic() < deadline, "the idle sandbox was never stopped"
        time.sleep(0.1)
    from tests.hermes.test_slash import _slash

    status = _slash()("")
    assert "stopped (idle timeout 2 s: stopped after that long without a command)" in status, status
    after = hermes.run("cat /root/f; pgrep -f 'slee[p] 1006' || echo no-sleeper")
    assert after["output"].split() == ["kept", "no-sleeper"], after
    stops = env.recorded.journal.records_of(StopRecord, sandbox=env.sandbox_name)
    assert [s.reason for s in stops] == ["idle"]
