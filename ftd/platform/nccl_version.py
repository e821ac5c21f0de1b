"""The NCCL version a job runs, from the line NCCL prints at init: ``NCCL version 2.21.5+cuda12.4``.

What: :func:`nccl_version` finds that version in one line of a rank's output, whatever comes before
it (the rank supervisor's ``[node rank]`` prefix, a timestamp, NCCL's ``host:pid:tid [dev] NCCL INFO``
header). Why a shared parser: the agent's inventory takes the NCCL version *as the job sees it* from
the job's output (the library the job loaded, not one installed somewhere on the node), and the job
checks read the same init lines for the transport NCCL chose; one parser keeps them in agreement.
Pure, bounded (only the first :data:`MAX_LINE` characters are read), never raises.
"""

from __future__ import annotations

import re

__all__ = ["MAX_LINE", "nccl_version"]

MAX_LINE = 4096
_VERSION = re.compile(r"\bNCCL version:? +(\d+\.\d+(?:\.\d+)*(?:[+-][0-9A-Za-z.]+)?)")


def nccl_version(line: str) -> str | None:
    """The version in an NCCL init line (``2.21.5+cuda12.4``), else ``None``."""
    if "NCCL version" not in line[:MAX_LINE]:
        return None
    match = _VERSION.search(line[:MAX_LINE])
    return match.group(1)[:64] if match else None
