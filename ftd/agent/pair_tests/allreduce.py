"""The all-reduce step of a pair test: each side runs one rank of a 2-rank gloo all-reduce.

What: :class:`AllReduceRank` starts :mod:`ftd.agent.pair_tests.allreduce_rank` as a process of its
own (its own session, so a hung collective is ended with its whole process group), with the Python
the operator names (``agent.pair_tests.allreduce_python``, a training image's: the rank file imports
nothing of ftd) or the agent's own, and ``GLOO_SOCKET_IFNAME`` set to the interface that holds the
pair test's own local address (:func:`ftd.agent.addresses.interface_with`), so the collective crosses
the link the test measured, and the test's rendezvous secret in ``FTD_ALLREDUCE_SECRET`` (the
environment, not argv, which ps shows to everyone). It reads the rank's JSON lines: rank 0's port
first, then the result (``gbps``), ``skipped`` (no torch there) or ``error``. Every wait is bounded
by the step's deadline; :meth:`AllReduceRank.stop` kills what is left.

Why: the TCP phases measure one stream each way; a collective is what a job runs, with gloo's (or
NCCL's) own transport, and it is what issue #35 asks a pair test to include where available.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from ftd.agent.addresses import interface_with

__all__ = ["RANK_FILE", "SECRET_ENV", "SECRET_HEX", "AllReduceRank", "AllReduceStep"]

RANK_FILE = str(Path(__file__).with_name("allreduce_rank.py"))
#: as allreduce_rank.SECRET_ENV (that file imports nothing of ftd, so the name is written twice)
SECRET_ENV = "FTD_ALLREDUCE_SECRET"
SECRET_HEX = 32  # 16 random bytes, hex
_MAX_LINE = 64 * 1024


class AllReduceStep:
    """What one side of the step needs: which Python, how many bytes at most, how long at most."""

    def __init__(self, *, max_bytes: int, timeout_s: float, python: str = "") -> None:
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.python = python or sys.executable


class AllReduceRank:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(
        cls,
        step: AllReduceStep,
        *,
        rank: int,
        host: str,
        port: int,
        nbytes: int,
        local_address: str,
        secret: str = "",
    ) -> AllReduceRank:
        env = dict(os.environ)
        if secret:
            env[SECRET_ENV] = secret
        ifname = interface_with(local_address)
        if ifname:
            env["GLOO_SOCKET_IFNAME"] = ifname
        env.setdefault("OMP_NUM_THREADS", "1")
        proc = await asyncio.create_subprocess_exec(
            step.python,
            RANK_FILE,
            "--rank",
            str(rank),
            "--host",
            host,
            "--port",
            str(port),
            "--bytes",
            str(nbytes),
            "--timeout",
            f"{step.timeout_s:g}",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            limit=_MAX_LINE,
        )
        return cls(proc)

    async def line(self) -> dict[str, Any]:
        """The rank's next JSON line; its end without one is an ``error``."""
        assert self.proc.stdout is not None
        raw = await self.proc.stdout.readline()
        if not raw:
            code = await self.proc.wait()
            return {"error": f"the all-reduce rank exited {code} without a result"}
        try:
            message = json.loads(raw)
        except ValueError:
            return {"error": f"the all-reduce rank said {raw[:200]!r}"}
        return message if isinstance(message, dict) else {"error": "the all-reduce rank said no object"}

    async def stop(self) -> None:
        """End the rank and everything it started (its session), if it still runs."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            await self.proc.wait()
