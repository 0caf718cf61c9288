"""The Hermes provider of the degraded backend: our generic provider base with another backend
behind it, as a cloud backend's plugin is. Loaded by a directory plugin the test writes into its
HERMES_HOME (``plugins/sandbox_degraded``)."""

from __future__ import annotations

from hermes_sandboxes.hermes.providers.base import SandboxProvider


class DegradedProvider(SandboxProvider):
    plugin_id = "sandbox_degraded"
    backend_name = "local-degraded"
    label = "Degraded sandbox"
    summary = "The local sandbox without diff, checkpoint deletion, tree kill, fork and terminal (tests)."
    environment_text = "a local Linux sandbox that cannot diff (tests)"


PLUGIN_INIT = '''
import sys
sys.path.insert(0, {repo!r})
from tests.contract import degraded
from hermes_sandboxes.hermes.plugin import register_provider


def register(ctx):
    degraded.register()
    register_provider(ctx, "tests.contract.degraded_hermes:DegradedProvider")
'''
