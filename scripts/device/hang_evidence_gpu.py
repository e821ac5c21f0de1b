"""Device check for issue #33 (not part of the suite): the agent's hang evidence from a real NCCL rank.

Run on a GPU machine from the repository root (``python3 scripts/device/hang_evidence_gpu.py PY_SPY``):
a child process runs a one-rank NCCL process group on GPU 0 with PyTorch's flight recorder on
(``TORCH_NCCL_TRACE_BUFFER_SIZE``) and its dump pipe configured (``TORCH_NCCL_DEBUG_INFO_PIPE_FILE``),
issues 40 all-reduces, then sits in a Python loop (a rank outside any collective). The agent's own
collector (:func:`ftd.agent.hang_evidence.collect_hang_evidence`) then takes its evidence without any
change to that program: ``py-spy --native`` stacks, the flight recorder through the pipe (JSON only),
NCCL RAS on localhost:28028, and the process state. It prints what each source gave and writes the
whole evidence to ``$OUT/evidence.json``.
"""

import asyncio
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.getcwd())

CHILD = r"""
import os, sys, time, torch, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29611", RANK="0", WORLD_SIZE="1")
torch.cuda.set_device(0)
dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
x = torch.ones(1 << 20, device="cuda")
for _ in range(40):
    dist.all_reduce(x)
torch.cuda.synchronize()
print("ready", torch.__version__, torch.cuda.nccl.version(), flush=True)
def stuck_outside_any_collective():
    while True:
        time.sleep(0.05)
stuck_outside_any_collective()
"""


async def main(py_spy: str) -> int:
    import msgspec

    from ftd.agent.hang_evidence import collect_hang_evidence
    from ftd.events import Directive, RankInfo

    out = os.environ.get("OUT", "/tmp")
    env = dict(
        os.environ,
        TORCH_NCCL_TRACE_BUFFER_SIZE="2000",
        TORCH_NCCL_DEBUG_INFO_PIPE_FILE="/tmp/ftd_fr_pipe_",
        TORCH_NCCL_DEBUG_INFO_TEMP_FILE="/tmp/ftd_fr_trace_",
        TORCH_NCCL_DUMP_ON_TIMEOUT="1",
        NCCL_RAS_ENABLE="1",
        NCCL_DEBUG="INFO",
        NCCL_DEBUG_FILE="/tmp/ftd_nccl.%h.%p.log",
        TORCH_WORKER_SERVER_SOCKET="/tmp/ftd_worker.sock",
    )
    child = subprocess.Popen([sys.executable, "-c", CHILD], env=env, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    line = child.stdout.readline().strip()
    print("child:", line, flush=True)
    try:
        directive = Directive(
            id="dev-hang-1", ts=time.time(), action="collect_hang_evidence", job="dev", deadline_s=30.0
        )
        ranks = [RankInfo(rank=0, local_rank=0, pid=child.pid, step=40, last_beat=time.time() - 5)]
        started = time.monotonic()
        evidence = await collect_hang_evidence(directive, ranks, out, node="h200", py_spy=py_spy)
        took = time.monotonic() - started
        for path in ("/handler/", "/handler/dump_nccl_trace_json?includeCollectives=true&onlyActive=false"):
            probe = subprocess.run(
                ["curl", "-s", "-m", "10", "-X", "POST", "--unix-socket", "/tmp/ftd_worker.sock", "http://x" + path],
                capture_output=True, text=True,
            )
            print("worker server", path, "rc", probe.returncode, probe.stdout[:1500], probe.stderr[:300], flush=True)
            with open(os.path.join(out, "worker_" + ("list" if path.endswith("/") else "json") + ".txt"), "w") as f:
                f.write(probe.stdout)
    finally:
        child.kill()
    body = msgspec.to_builtins(evidence)
    with open(os.path.join(out, "evidence.json"), "w") as f:
        json.dump(body, f, indent=1)
    rank = body["ranks"][0]
    main_stack = next((t for t in rank["stacks"] if t.get("main")), rank["stacks"][0] if rank["stacks"] else None)
    frames = main_stack["frames"] if main_stack else []
    flight = rank.get("flight") or {}
    entries = flight.get("entries") or []
    summary = {
        "collect_s": round(took, 2),
        "state": rank["state"],
        "threads": len(rank["stacks"]),
        "main_frames": [f["function"] for f in frames[:6]],
        "native_frames": sum(1 for t in rank["stacks"] for f in t["frames"] if f.get("native")),
        "flight_entries": len(entries),
        "flight_last": entries[-3:],
        "flight_version": flight.get("version"),
        "rank_errors": rank["errors"],
        "files": rank["files"],
        "ras": body["ras"],
        "node_errors": body["errors"],
    }
    print(json.dumps(summary, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1])))
