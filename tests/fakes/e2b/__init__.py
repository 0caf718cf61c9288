"""A loopback fake E2B (control plane + envd) whose sandboxes are real local sandboxes.

The real ``e2b`` SDK runs against it unmodified; see server.py for how to point it there.
"""

from tests.fakes.e2b.server import API_KEY, FakeE2B, running_fake
from tests.fakes.e2b.world import Recorded

__all__ = ["API_KEY", "FakeE2B", "Recorded", "running_fake"]
