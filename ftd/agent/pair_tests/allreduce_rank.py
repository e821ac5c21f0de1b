"""One rank of a pair test's all-reduce step: ``python -m ftd.agent.pair_tests.allreduce_rank``.

What: rank 0 opens a ``torch.distributed.TCPStore`` on ``--host`` (port 0: the kernel picks one) and
prints ``{"port": P}``; rank 1 joins it at ``--host``:``--port``. Both form a 2-rank gloo process
group over the interface ``GLOO_SOCKET_IFNAME`` names (the parent sets it to the interface of the
pair test's own connection), all-reduce a float32 tensor of zeros of ``--bytes`` once to warm up,
then ``--iters`` times timed, and print ``{"gbps": ..., "seconds": [...]}``: the bus bandwidth of
the fastest all-reduce (for two ranks it equals the algorithm bandwidth, bytes x 8 / seconds). Torch
missing: ``{"skipped": why}`` and exit 0 (a node without torch has no all-reduce to test, which is
not a failure of the pair). Anything else: ``{"error": why}`` and exit 1.

Why a process of its own: the agent never imports torch (hundreds of MB, seconds to import, threads
of its own), and a gloo group that hangs is ended by killing its process group, which the caller
does at its deadline. The rendezvous runs under the prefix ``$FTD_ALLREDUCE_SECRET`` (the
test's secret, which the server made and told only its peer), so one who reaches the store cannot
join as a rank. Only zeros are reduced and nothing received is unpickled: the store exchanges
gloo's addresses and the ranks' keys, the collective raw float32 bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta

#: the environment variable the parent passes the test's rendezvous secret in (not argv: ps shows it)
SECRET_ENV = "FTD_ALLREDUCE_SECRET"


def _say(message: dict[str, object]) -> None:
    print(json.dumps(message), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ftd.agent.pair_tests.allreduce_rank")
    parser.add_argument("--rank", type=int, choices=(0, 1), required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--bytes", type=int, required=True)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        _say({"skipped": f"torch is not installed for {sys.executable}: {exc}"})
        return 0
    try:
        timeout = timedelta(seconds=args.timeout)
        if args.rank == 0:
            store = dist.TCPStore(  # type: ignore[attr-defined]
                args.host, 0, 2, is_master=True, timeout=timeout, wait_for_workers=False
            )
            _say({"port": store.port})
        else:
            store = dist.TCPStore(  # type: ignore[attr-defined]
                args.host, args.port, 2, is_master=False, timeout=timeout
            )
        # the rendezvous under the test's secret: one who reaches the store but not the test's
        # connection finds no key of this pair's and cannot take a rank's place
        secret = os.environ.pop(SECRET_ENV, "")
        keys = dist.PrefixStore(f"ftd-pair-{secret}/", store) if secret else store  # type: ignore[attr-defined]
        dist.init_process_group("gloo", store=keys, rank=args.rank, world_size=2, timeout=timeout)
        tensor = torch.zeros(max(1, args.bytes // 4), dtype=torch.float32)
        dist.all_reduce(tensor)  # warm-up: gloo's connections are made here
        seconds = []
        for _ in range(max(1, args.iters)):
            t0 = time.perf_counter()
            dist.all_reduce(tensor)
            seconds.append(time.perf_counter() - t0)
        nbytes = tensor.numel() * tensor.element_size()
        dist.destroy_process_group()
        _say({"gbps": nbytes * 8 / min(seconds) / 1e9, "seconds": seconds, "bytes": nbytes})
        return 0
    except Exception as exc:  # a failed step is said, as one line, never a traceback to parse
        _say({"error": f"{type(exc).__name__}: {str(exc)[:300]}"})
        return 1


if __name__ == "__main__":
    sys.exit(main())
