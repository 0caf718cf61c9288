"""The agent tools on a backend that cannot diff, delete checkpoints or kill whole trees: a real
Hermes loads a second provider of ours (a directory plugin over the degraded backend of the
contract suite) and the tools say what the backend cannot do instead of failing obscurely."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import yaml

if TYPE_CHECKING:
    from tests.hermes.conftest import HermesHarness


from tests.contract.degraded import WRAPPER_REFUSED
from tests.contract.degraded_hermes import PLUGIN_INIT

REPO = str(Path(__file__).resolve().parents[2])  # the plugin's child Hermes imports the fakes from here


def _use_degraded_backend(hermes: HermesHarness, **settings: object) -> None:
    plugin = hermes.home / "plugins" / "sandbox_degraded"
    plugin.mkdir(parents=True)
    (plugin / "plugin.yaml").write_text("name: sandbox_degraded\nversion: '1'\ndescription: degraded (tests)\n")
    (plugin / "__init__.py").write_text(PLUGIN_INIT.format(repo=REPO))
    config = {"terminal": {"backend": "sandbox_degraded"},
              "plugins": {"enabled": ["sandbox_degraded"],
                          "entries": {"sandbox_degraded": {"settings": {"name_prefix": hermes.prefix, **settings}}}}}
    (hermes.home / "config.yaml").write_text(yaml.safe_dump(config))
    hermes.monkeypatch.setenv("TERMINAL_ENV", "sandbox_degraded")
    from hermes_cli.plugins import _reset_plugin_managers_for_tests, discover_plugins

    _reset_plugin_managers_for_tests()
    discover_plugins(force=True)


def test_the_agent_tools_say_what_a_degraded_backend_cannot_do(hermes: HermesHarness) -> None:
    _use_degraded_backend(hermes, retention=1)
    assert hermes.run("echo hello")["output"].strip() == "hello"
    taken = hermes.call("sandbox_checkpoint", {"comment": "before"})["checkpoint"]
    diff = hermes.call("sandbox_diff", {"id": taken})
    assert "cannot diff" in diff["error"] and WRAPPER_REFUSED not in diff["error"]  # the tool's own check
    for i in range(2):  # two automatic checkpoints with a retention of one: none can be deleted
        assert "sandbox_restore" in hermes.run(f"rm -rf /root/d{i}")["output"]
    listed = hermes.call("sandbox_checkpoints", {})
    assert len(listed["checkpoints"]) == 3 and "cannot delete checkpoints" in listed["retention"]
    assert WRAPPER_REFUSED not in listed["retention"]
    assert hermes.call("sandbox_restore", {"id": taken})["restored"] == taken
