"""Fixtures of the integration tests: ``tests/unit``'s own (the tests here came from there).

``tests/integration`` holds the tests that, like the unit tests, start what they need themselves on
free ports and so run in parallel with them in ``make test``, but that cost real time: real
processes (``ftd`` commands and the shipped shell hooks as subprocesses, PostgreSQL, PyTorch ranks)
or in-process daemons waiting on wall-clock timeouts. ``make unit`` (the inner loop) leaves them out.
"""

from __future__ import annotations

from tests.unit.conftest import api, rec, sockdir

__all__ = ["api", "rec", "sockdir"]
