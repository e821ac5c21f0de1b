"""``python -m ftd.agent.pair_tests serve|run|agent``: pair-test server and client as their own process.

What: ``serve`` runs a :class:`~ftd.agent.pair_tests.server.PairTestServer` until SIGTERM, printing
its port first; ``run`` runs :func:`~ftd.agent.pair_tests.client.run_pair_test` once and prints the
result as one JSON line; ``agent`` serves and also runs the tests it is asked on stdin (one JSON
object a line: ``{"peer_node", "host", "port", "max_bytes", "timeout", "pings", "allreduce_bytes"}``; or
``{"mesh": [[node, host, port], ...], "interval": s, "seconds": s}`` to probe each peer in turn, one
every ``interval``), answering each with one JSON line: the pair-test half of an agent, driven the
way the coordinator's directives drive it. ``--allreduce-bytes`` (0: none) gives the server and
``run`` the all-reduce step (``agent``: per request, ``allreduce_bytes``). The key is read from a
file (``--key-file``), never from the command line.
Why: the network-namespace test and ``ftd bench pairs`` run the real server and client as separate
processes inside namespaces (``ip netns exec``), with the agent's code and nothing else around it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path

from ftd.agent.pair_tests.allreduce import AllReduceStep
from ftd.agent.pair_tests.client import PairPeer, run_pair_test
from ftd.agent.pair_tests.mesh import pingmesh
from ftd.agent.pair_tests.server import PairTestServer
from ftd.logs import configure


async def _started(args: argparse.Namespace, key: bytes) -> PairTestServer:
    """The server, listening, its port printed first (what the caller waits for)."""
    server = PairTestServer(
        node=args.node,
        key=key,
        host=args.host,
        port=args.port,
        max_bytes=args.max_bytes,
        max_seconds=args.timeout,
        allreduce=_step(args, args.allreduce_bytes),
    )
    port = await server.start()
    print(json.dumps({"port": port}), flush=True)
    return server


def _step(args: argparse.Namespace, nbytes: int) -> AllReduceStep | None:
    """The all-reduce step of ``nbytes`` (0: none), with this process's timeout and Python."""
    if nbytes <= 0:
        return None
    return AllReduceStep(max_bytes=nbytes, timeout_s=args.allreduce_timeout, python=args.allreduce_python)


async def _serve(args: argparse.Namespace, key: bytes) -> None:
    server = await _started(args, key)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.close()


async def _agent(args: argparse.Namespace, key: bytes) -> None:
    server = await _started(args, key)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        request = json.loads(line)
        if "mesh" in request:
            peers = [PairPeer(node=n, host=h, port=int(p)) for n, h, p in request["mesh"]]
            probes = await pingmesh(
                peers,
                node=args.node,
                key=key,
                interval_s=float(request["interval"]),
                seconds=float(request["seconds"]),
            )
            print(json.dumps({"probes": probes, "served": server.served}), flush=True)
            continue
        result = await run_pair_test(
            PairPeer(node=request["peer_node"], host=request["host"], port=int(request["port"])),
            node=args.node,
            key=key,
            max_bytes=int(request.get("max_bytes", args.max_bytes)),
            timeout_s=float(request.get("timeout", args.timeout)),
            pings=int(request.get("pings", args.pings)),
            allreduce=_step(args, int(request.get("allreduce_bytes", 0))),
        )
        print(json.dumps(result.as_dict()), flush=True)
    await server.close()


async def _run(args: argparse.Namespace, key: bytes) -> None:
    host, _, port = args.peer.rpartition(":")
    result = await run_pair_test(
        PairPeer(node=args.peer_node, host=host, port=int(port)),
        node=args.node,
        key=key,
        max_bytes=args.max_bytes,
        timeout_s=args.timeout,
        pings=args.pings,
        allreduce=_step(args, args.allreduce_bytes),
    )
    print(json.dumps(result.as_dict()), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ftd.agent.pair_tests")
    parser.add_argument("mode", choices=("serve", "run", "agent"))
    parser.add_argument("--node", required=True)
    parser.add_argument("--key-file", type=Path, required=True)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--peer", default="", help="HOST:PORT (run)")
    parser.add_argument("--peer-node", default="")
    parser.add_argument("--max-bytes", type=int, default=4 * 1024 * 1024)
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--pings", type=int, default=5)
    parser.add_argument("--allreduce-bytes", type=int, default=0, help="the all-reduce step (0: none)")
    parser.add_argument("--allreduce-timeout", type=float, default=60.0)
    parser.add_argument("--allreduce-python", default="", help="the Python that runs the ranks")
    args = parser.parse_args(argv)
    configure("info")  # the log on stderr: stdout carries only the JSON lines the caller reads
    key = args.key_file.read_bytes().strip()
    modes = {"serve": _serve, "run": _run, "agent": _agent}
    asyncio.run(modes[args.mode](args, key))
    return 0


if __name__ == "__main__":
    sys.exit(main())
