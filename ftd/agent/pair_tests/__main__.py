"""``python -m ftd.agent.pair_tests serve|run``: one pair-test server or one test, as its own process.

What: ``serve`` runs a :class:`~ftd.agent.pair_tests.server.PairTestServer` until SIGTERM, printing
its port first; ``run`` runs :func:`~ftd.agent.pair_tests.client.run_pair_test` once and prints the
result as one JSON line. The key is read from a file (``--key-file``), never from the command line.
Why: the network-namespace test and ``ftd bench fabric`` run the real server and client as separate
processes inside namespaces (``ip netns exec``), with the agent's code and nothing else around it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path

from ftd.agent.pair_tests.client import PairPeer, run_pair_test
from ftd.agent.pair_tests.server import PairTestServer


async def _serve(args: argparse.Namespace, key: bytes) -> None:
    server = PairTestServer(
        node=args.node,
        key=key,
        host=args.host,
        port=args.port,
        max_bytes=args.max_bytes,
        max_seconds=args.timeout,
    )
    port = await server.start()
    print(json.dumps({"port": port}), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
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
    )
    print(json.dumps(result.as_dict()), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ftd.agent.pair_tests")
    parser.add_argument("mode", choices=("serve", "run"))
    parser.add_argument("--node", required=True)
    parser.add_argument("--key-file", type=Path, required=True)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--peer", default="", help="HOST:PORT (run)")
    parser.add_argument("--peer-node", default="")
    parser.add_argument("--max-bytes", type=int, default=4 * 1024 * 1024)
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--pings", type=int, default=5)
    args = parser.parse_args(argv)
    key = args.key_file.read_bytes().strip()
    asyncio.run(_serve(args, key) if args.mode == "serve" else _run(args, key))
    return 0


if __name__ == "__main__":
    sys.exit(main())
