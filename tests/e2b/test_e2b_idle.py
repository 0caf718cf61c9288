"""``idle_timeout`` on E2B is the lease: a sandbox the service paused when it ran out keeps its files
and the next command resumes it; a per-sandbox value other than the settings' is refused."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator

import pytest

from hermes_sandboxes.backends.e2b import E2BBackend
from hermes_sandboxes.backends.e2b.settings import E2BSettings
from hermes_sandboxes.errors import Unsupported
from hermes_sandboxes.sandbox import SandboxSpec
from hermes_sandboxes.settings import InvalidSettings, validate_settings
from tests.fakes.e2b import API_KEY, FakeE2B


@pytest.fixture
def idle_backend(fake: FakeE2B) -> Iterator[E2BBackend]:
    settings = validate_settings(E2BSettings, {"idle_timeout": "1m", "command_grace_seconds": 0}, where="e2b")
    with E2BBackend(settings, api_key=API_KEY, profile=f"/profiles/{secrets.token_hex(4)}",
                    api_url=fake.url, sandbox_url=fake.url) as backend:
        yield backend


def test_the_lease_is_the_idle_timeout_and_a_paused_sandbox_resumes(fake: FakeE2B, idle_backend: E2BBackend) -> None:
    sb = idle_backend.open("idle", idle_backend.settings.spec())
    try:
        (create,) = fake.calls("POST", "/v2/sandboxes")
        assert create.body["timeout"] == 60 + 6 and create.body["autoPause"] is True  # the lease, its headroom
        assert sb.exec("echo kept > /home/user/f && (setsid sleep 1004 >/dev/null 2>&1 &)").exit_code == 0
        remote = fake.world.get(sb.sandbox_id)
        assert remote is not None
        remote.end_at = time.time() - 1  # the lease ran out: nothing ran for the idle timeout
        fake.world.sweep()
        assert remote.state == "paused"
        after = sb.exec("cat /home/user/f; pgrep -f 'slee[p] 1004' || echo no-sleeper")
        assert after.stdout.split() == ["kept", "no-sleeper"], after
        assert remote.state == "running"
        assert any(call.path.endswith("/connect") and call.body.get("timeout", 0) >= 60
                   for call in fake.calls("POST")), "resumed with a lease of the idle timeout"
    finally:
        sb.destroy()


def test_a_per_sandbox_idle_timeout_other_than_the_lease_is_refused(idle_backend: E2BBackend) -> None:
    with pytest.raises(Unsupported, match="idle timeout is the lease"):
        idle_backend.open("other", SandboxSpec(network="host", idle_timeout=5))
    with pytest.raises(InvalidSettings, match="longest lease"):
        validate_settings(E2BSettings, {"idle_timeout": "2d"}, where="e2b")
