"""``python -m ftd.bench.bulk_flow sink|send``: one bulk TCP flow held between two hosts, as a process.

What: ``sink --host H --port P`` listens, prints ``{"port": P}`` once it does, and reads and discards
whatever one connection sends until it closes; ``send --host H --port P`` connects and writes as fast
as the socket takes it until it is killed (SIGTERM) or the connection breaks.
Why: the namespace fleet (:meth:`ftd.bench.netns_fleet.NetnsFleet.bloat`) needs a real flow that
keeps a node's shaped egress queue full, so that everything else it sends (a pingmesh probe, a pair
test's round trips) waits behind it: the queueing delay of a congested link with a deep buffer,
which this kernel's qdiscs can give (tbf with a large ``latency``) where netem's fixed delay is
missing. Plain sockets, nothing else: the flow is what a checkpoint upload hogging a link looks like.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import sys

CHUNK = 64 * 1024


def sink(host: str, port: int) -> None:
    with socket.create_server((host, port)) as server:
        print(json.dumps({"port": server.getsockname()[1]}), flush=True)
        conn, _ = server.accept()
        with conn:
            while conn.recv(1 << 20):
                pass


def send(host: str, port: int) -> None:
    data = b"\0" * CHUNK
    with socket.create_connection((host, port), timeout=30) as conn, contextlib.suppress(OSError):
        conn.settimeout(None)
        while True:
            conn.sendall(data)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ftd.bench.bulk_flow")
    parser.add_argument("mode", choices=("sink", "send"))
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    (sink if args.mode == "sink" else send)(args.host, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
