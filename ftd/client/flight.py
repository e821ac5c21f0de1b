"""The rank's own flight-recorder dump, as JSON, for the agent collecting a hang's evidence (issue #33).

What: :func:`dump_json` asks PyTorch for its flight recorder's trace of this process
(``torch._C._distributed_c10d._dump_fr_trace_json``: every process group's recent collectives with
their sequence ids, states and timings) and writes it to a new private file the agent then reads.

Why from inside the rank: the dump PyTorch triggers itself (``TORCH_NCCL_DEBUG_INFO_PIPE_FILE``, read
by ProcessGroupNCCL's watchdog) is written as a pickle, which the agent refuses to unpickle (a rank
is not trusted with code execution in a root daemon), and gloo has no such trigger at all. The JSON
dump works for both backends and from any thread: the client's reader thread answers while the
training thread waits in a hung collective (measured under 1 ms for a small trace on CPU).

Never imports torch: a process that did not import it has no flight recorder. Python 3.9, stdlib only.
"""

from __future__ import annotations

import os
import sys
import tempfile

TYPE_CHECKING = False  # not imported from typing: keeps `import ftd.client` light
if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["MAX_DUMP_BYTES", "dump_json"]

MAX_DUMP_BYTES = 8 << 20
"""A dump larger than this is not written (the agent would not read it either)."""


def _dump_function() -> Callable[..., object] | str:
    """PyTorch's JSON dump of this process's flight recorder, or why there is none."""
    torch = sys.modules.get("torch")
    if torch is None:
        return "torch is not imported by this process"
    try:
        c10d = torch._C._distributed_c10d
    except AttributeError:
        return "this torch has no distributed support"
    dump = getattr(c10d, "_dump_fr_trace_json", None)
    if not callable(dump):
        return f"torch {getattr(torch, '__version__', '?')} has no JSON flight-recorder dump"
    return dump  # type: ignore[no-any-return]


def dump_json(
    directory: str | None = None, dump: Callable[..., object] | None = None
) -> tuple[str | None, str]:
    """Write the flight recorder's JSON dump to a new file; (its path, '') or (None, why not).

    ``dump`` replaces PyTorch's function (tests). Never raises."""
    found = dump if dump is not None else _dump_function()
    if isinstance(found, str):
        return None, found
    try:
        data = found(True, False)  # every collective's trace, not only the active ones
    except Exception as exc:  # e.g. no process group, the recorder off (TORCH_FR_BUFFER_SIZE unset)
        return None, f"the flight-recorder dump failed: {type(exc).__name__}: {exc}"[:500]
    if isinstance(data, str):
        data = data.encode()
    if not isinstance(data, bytes):
        return None, f"the flight-recorder dump returned {type(data).__name__}, not JSON text"
    if len(data) > MAX_DUMP_BYTES:
        return None, f"the flight-recorder dump is {len(data)} bytes, over {MAX_DUMP_BYTES}"
    try:
        fd, path = tempfile.mkstemp(prefix="ftd-flight-", suffix=".json", dir=directory)  # mode 0600
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
    except OSError as exc:
        return None, f"cannot write the flight-recorder dump: {exc}"[:500]
    return path, ""
