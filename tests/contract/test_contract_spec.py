"""The contract for re-opening a sandbox with a spec, run against every backend (see conftest.TARGETS):
the same spec resumes it, no spec resumes it as it is, and a spec that differs in a field the backend
can see is refused in one line naming the field and both values, never silently ignored."""

from __future__ import annotations

import dataclasses
import re

import pytest

from hermes_sandboxes.errors import SpecMismatch
from hermes_sandboxes.names import unique_name
from hermes_sandboxes.sandbox import Backend, Capability, SandboxSpec


def _made_with(backend: Backend) -> SandboxSpec:
    """A spec every backend can honour: an allow-list where there is one, else the open network."""
    if Capability.EGRESS_ALLOWLIST in backend.capabilities:
        return SandboxSpec(network="proxy", allow=("a.example",), labels={"team": "a"})
    return SandboxSpec(network="host", labels={"team": "a"})


def test_open_resumes_the_same_spec_and_refuses_another_naming_both_values(backend: Backend) -> None:
    made = _made_with(backend)
    name = unique_name("ct")
    first = backend.open(name, made)
    try:
        assert first.created is True
        assert backend.open(name, made).created is False  # the normal re-open: the settings did not change
        assert backend.open(name).created is False  # no spec: as it is
        refused = [(dataclasses.replace(made, labels={"team": "b"}), "labels {'team': 'a'}, not {'team': 'b'}")]
        if made.network == "proxy":
            refused += [(SandboxSpec(network="host", labels={"team": "a"}), "network proxy, not host"),
                        (dataclasses.replace(made, allow=("b.example",)), "allow [a.example], not [b.example]")]
        for spec, phrase in refused:
            with pytest.raises(SpecMismatch) as exc:
                backend.open(name, spec)
            message = str(exc.value)
            assert "\n" not in message and re.search(f"sandbox {name} exists with .*{re.escape(phrase)}", message), \
                message
        again = backend.open(name, made)  # nothing of a refused open was applied
        assert again.created is False and again.info().spec.network == made.network
        assert again.info().spec.allow == made.allow
    finally:
        backend.get(name).destroy()
