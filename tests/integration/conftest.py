"""Fixtures the integration tests share with the unit tests: the agent's local API on a real socket
(the tests moved here for their wall-clock waits use the same server the unit tests do)."""

from tests.unit.conftest import api, rec, sockdir

__all__ = ["api", "rec", "sockdir"]
