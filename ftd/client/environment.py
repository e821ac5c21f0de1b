"""Reading the client's defaults from the environment, never raising.

What: :func:`env` (the first set variable of several) and :func:`env_int` (the first that is an
integer). Why apart: the schedulers name the same thing differently (``SLURM_PROCID``, ``RANK``...),
and a malformed value must be skipped with a warning, not raised into the training process.
"""

from __future__ import annotations

import logging
import os

__all__ = ["DEFAULT_JOB", "env", "env_int"]

DEFAULT_JOB = "default"

_log = logging.getLogger("ftd.client")


def env(*names: str) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


def env_int(*names: str) -> int | None:
    """The first of ``names`` set to an integer (a malformed value is skipped, never raised)."""
    for name in names:
        value = os.environ.get(name)
        if not value:
            continue
        try:
            return int(value)
        except ValueError:
            _log.warning("ftd client: ignoring non-integer %s=%r", name, value)
    return None
