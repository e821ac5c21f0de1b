"""Run the ``--preflight`` command before a node's ranks start on it (a spare, above all).

What: :func:`run_preflight`: the command (``ftd preflight`` by default; ``none`` skips) runs with a
deadline; exit 0 is ``ok``, anything else ``failed`` with the first line of its output as the reason
(what the coordinator and ``ftd status`` show). Why: a spare is used only after a passing check, so
a slot is never handed to a node that cannot train.
"""

from __future__ import annotations

import shlex
import subprocess

__all__ = ["run_preflight"]

PREFLIGHT_TIMEOUT_S = 300.0


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:500]
    return ""


def run_preflight(command: str, timeout_s: float = PREFLIGHT_TIMEOUT_S) -> tuple[bool, str]:
    """(ok, reason): ``reason`` is empty on success, else says why (first line of the output)."""
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        return False, f"preflight command {command!r} cannot be parsed: {exc}"
    if not argv:
        return False, "preflight command is empty"
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False, f"preflight {argv[0]} did not finish within {timeout_s:.0f} s"
    except OSError as exc:
        return False, f"preflight {argv[0]} could not start: {exc}"
    if done.returncode == 0:
        return True, ""
    first = _first_line(done.stdout.decode(errors="replace"))
    return False, f"preflight {argv[0]} exited {done.returncode}" + (f": {first}" if first else "")
