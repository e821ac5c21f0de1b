"""A fleet of real pair-test agents, one per network namespace, on one bridge; a link degraded by tc.

What: :class:`NetnsFleet` creates ``n`` network namespaces, each with a veth into one bridge and an
address on a private /24, and in each a real process running the pair-test half of an agent
(``python -m ftd.agent.pair_tests agent``: its server, and the tests it is asked on stdin).
:meth:`NetnsFleet.degrade` shapes one node's egress with ``tc qdisc ... tbf`` (rate); this kernel has
no netem, so :meth:`NetnsFleet.lose` drops a share of its packets with netfilter (loss) and
:meth:`NetnsFleet.bloat` keeps a deep tbf queue on its egress full with a bulk flow (queueing delay);
:meth:`NetnsFleet.wave` runs disjoint pair tests (or pingmesh probes) and answers their
:class:`~ftd.fabric.pairs.PairResult` s, :meth:`NetnsFleet.mesh` a node's own pingmesh; :func:`hunt` drives a
:class:`~ftd.fabric.bisect.Bisection` over the fleet, judging each wave against the fleet's baseline
(:func:`~ftd.fabric.pairs.judge_pair`), and answers the finding. Everything it made is removed on
exit, also after a failure (namespaces, the bridge, the processes).

Why here: the network-namespace integration test and ``ftd bench pairs`` both need it; it needs
root and ``ip``/``tc`` (:func:`available` says why not, so a caller can skip with the reason).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from ftd.fabric.bisect import Bisection, Finding
from ftd.fabric.pairs import PairExpectation, PairResult, fleet_baseline, fleet_rtt_baseline, judge_pair

__all__ = ["RIG", "Hunt", "NetnsFleet", "available", "hunt"]

PORT = 7411

#: What this rig expects of a pair: no spec (veth has none), and a direction below a fifth of the
#: fleet's median is slow. Veth between namespaces is bound by the CPU, not a wire: on the shared
#: 2-core machine clean directions range 5-24 Gbit/s (a clean direction at 0.57 x the median was
#: measured), so the packaged profiles' 0.5 would flag scheduling noise; a NIC-bound fabric varies
#: far less. The degraded node (tbf 20 Mbit/s) measures ~0.3% of the median.
RIG = PairExpectation(expected_gbps=None, baseline_fraction=0.2)
RIG_PROFILE = "netns-veth"


def available() -> str | None:
    """Why a namespace fleet cannot be built here, or ``None`` when it can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"{tool} (iproute2) not installed"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


class NetnsFleet:
    def __init__(
        self, n: int, *, max_bytes: int = 4 * 1024 * 1024, timeout_s: float = 10.0, allreduce_bytes: int = 0
    ) -> None:
        self.n = n
        self.allreduce_bytes = allreduce_bytes  # each agent's cap on the all-reduce step (0: off)
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.tag = "ftp" + secrets.token_hex(3)
        self.nodes = [f"node-{i:02d}" for i in range(1, n + 1)]
        octets = secrets.randbelow(200) + 20, secrets.randbelow(250) + 1
        self.subnet = f"10.{octets[0]}.{octets[1]}"
        self.addresses = {node: f"{self.subnet}.{i}" for i, node in enumerate(self.nodes, start=1)}
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.degraded: dict[str, str] = {}
        self._flows: dict[str, list[subprocess.Popen[str]]] = {}  # bloat(): each node's bulk flow
        self._dir = Path(tempfile.mkdtemp(prefix="ftd-netns-"))
        self.key_file = self._dir / "pair.key"
        self.key_file.write_text(secrets.token_hex(32))
        self._namespaces: list[str] = []
        self._bridge = f"{self.tag}br"

    def namespace(self, node: str) -> str:
        return f"{self.tag}-{self.nodes.index(node) + 1}"

    def __enter__(self) -> NetnsFleet:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _build(self) -> None:
        _ip("link", "add", self._bridge, "type", "bridge")
        _ip("link", "set", self._bridge, "up")
        for i, node in enumerate(self.nodes, start=1):
            ns = self.namespace(node)
            _ip("netns", "add", ns)
            self._namespaces.append(ns)
            veth = f"{self.tag}v{i}"
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", veth, "master", self._bridge, "up")
            _ip("-n", ns, "addr", "add", f"{self.addresses[node]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        for node in self.nodes:
            command = [
                "ip", "netns", "exec", self.namespace(node),
                sys.executable, "-m", "ftd.agent.pair_tests", "agent",
                "--node", node, "--key-file", str(self.key_file), "--host", self.addresses[node],
                "--port", str(PORT), "--max-bytes", str(self.max_bytes), "--timeout", str(self.timeout_s),
                "--allreduce-bytes", str(self.allreduce_bytes),
            ]  # fmt: skip
            self.procs[node] = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, bufsize=1
            )
        for node, proc in self.procs.items():
            line = self._readline(proc, 60.0)
            if json.loads(line).get("port") != PORT:
                raise RuntimeError(f"{node}: agent did not start: {line!r}")

    @staticmethod
    def _readline(proc: subprocess.Popen[str], timeout_s: float) -> str:
        import selectors

        out: IO[str] | None = proc.stdout
        assert out is not None
        with selectors.DefaultSelector() as sel:
            sel.register(out, selectors.EVENT_READ)
            if not sel.select(timeout_s):
                raise TimeoutError(f"no answer from pid {proc.pid} in {timeout_s:g} s")
        line = out.readline()
        if not line:
            raise RuntimeError(f"pid {proc.pid} exited (rc {proc.poll()})")
        return line

    def degrade(self, node: str, rate: str = "20mbit") -> None:
        """Shape ``node``'s egress to ``rate`` (tbf on its eth0); undo with :meth:`restore`."""
        _ip("netns", "exec", self.namespace(node), "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf",
            "rate", rate, "burst", "32kbit", "latency", "50ms")  # fmt: skip
        self.degraded[node] = rate

    def lose(self, node: str, fraction: float) -> None:
        """Lose ``fraction`` of ``node``'s egress packets at random on the way (netfilter's statistic
        match in every other namespace's INPUT, on packets from ``node``'s address: a bad cable or
        port on its transmit side, real loss that TCP must detect and send again; a drop in the
        sender's own OUTPUT is not loss to TCP, which retries it at once); undo with :meth:`restore`."""
        if shutil.which("iptables") is None:
            raise RuntimeError("iptables is not installed (scripts/install-real-parts.sh installs it)")
        source = self.addresses[node]
        for other in self.nodes:
            if other != node:
                ns = self.namespace(other)
                _ip("netns", "exec", ns, "iptables", "-A", "INPUT", "-s", source, "-m", "statistic",
                    "--mode", "random", "--probability", f"{fraction:g}", "-j", "DROP")  # fmt: skip
        self.degraded[node] = f"loss {fraction:g}"

    def bloat(self, node: str, *, rate: str = "10mbit", queue_ms: int = 300, to: str | None = None) -> None:
        """Queueing delay on ``node``'s egress: tbf at ``rate`` with a queue ``queue_ms`` deep, kept
        full by a bulk TCP flow from ``node`` to ``to`` (default: the next node), so whatever else it
        sends waits behind the flow's bytes -- a congested link with a deep buffer (bufferbloat).
        This kernel has no netem (no fixed delay); this is real delay that a probe's round trip sees.
        Undo with :meth:`restore` (the flow is stopped, the qdisc removed)."""
        sink_node = to or self.nodes[(self.nodes.index(node) + 1) % len(self.nodes)]
        _ip("netns", "exec", self.namespace(node), "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf",
            "rate", rate, "burst", "32kbit", "latency", f"{queue_ms}ms")  # fmt: skip
        self.degraded[node] = f"bloat {rate} {queue_ms}ms"
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        address, port = self.addresses[sink_node], str(PORT + 1)
        flows = self._flows.setdefault(node, [])
        for ns, mode in ((self.namespace(sink_node), "sink"), (self.namespace(node), "send")):
            command = ["ip", "netns", "exec", ns, sys.executable, "-m", "ftd.bench.bulk_flow", mode,
                       "--host", address, "--port", port]  # fmt: skip
            flows.append(
                subprocess.Popen(
                    command, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=env
                )
            )
            if mode == "sink":
                line = self._readline(flows[-1], 30.0)
                if json.loads(line).get("port") != PORT + 1:
                    raise RuntimeError(f"{sink_node}: bulk-flow sink did not start: {line!r}")

    def _stop_flows(self, node: str) -> None:
        for proc in self._flows.pop(node, []):
            if proc.poll() is None:
                proc.terminate()
            _reap(proc)

    def restore(self, node: str) -> None:
        self._stop_flows(node)
        what = self.degraded.pop(node, "")
        if what.startswith("loss"):
            for other in self.nodes:
                if other != node:
                    _ip("netns", "exec", self.namespace(other), "iptables", "-F", "INPUT")
        else:
            _ip("netns", "exec", self.namespace(node), "tc", "qdisc", "del", "dev", "eth0", "root")

    def ask(self, node: str, request: dict[str, Any]) -> None:
        stdin = self.procs[node].stdin
        assert stdin is not None
        stdin.write(json.dumps(request) + "\n")
        stdin.flush()

    def answer(self, node: str, timeout_s: float) -> dict[str, Any]:
        data = json.loads(self._readline(self.procs[node], timeout_s))
        if not isinstance(data, dict):
            raise RuntimeError(f"{node}: answer not an object")
        return data

    def test_request(self, peer: str, *, probe: bool = False) -> dict[str, Any]:
        """Ask for a pair test against ``peer``; ``probe``: a pingmesh probe (round trips, no bulk)."""
        request: dict[str, Any] = {"peer_node": peer, "host": self.addresses[peer], "port": PORT}
        return {**request, "max_bytes": 0, "pings": 3} if probe else request

    def mesh(self, node: str, *, interval_s: float = 0.2, rounds: int = 1) -> list[dict[str, Any]]:
        """``node``'s pingmesh over every other node, ``rounds`` times, one probe every ``interval_s``
        (the agent's own :func:`~ftd.agent.pair_tests.mesh.pingmesh`): its probes' answers."""
        peers = [[n, self.addresses[n], PORT] for n in self.nodes if n != node]
        seconds = interval_s * (len(peers) * rounds + 0.5)  # half an interval's grace for the last probe
        self.ask(node, {"mesh": peers, "interval": interval_s, "seconds": seconds})
        probes = self.answer(node, seconds + 30.0).get("probes")
        if not isinstance(probes, list):
            raise RuntimeError(f"{node}: mesh answer has no probes")
        return probes

    def wave(
        self, pairs: Sequence[tuple[str, str]], *, concurrent: bool = False, probe: bool = False
    ) -> list[PairResult]:
        """Run pair tests (``a`` tests against ``b``); all at once, or one after another; ``probe``:
        pingmesh probes instead (round trips only)."""
        limit = self.timeout_s + 30.0
        if concurrent:
            for a, b in pairs:
                self.ask(a, self.test_request(b, probe=probe))
            return [PairResult.from_dict(self.answer(a, limit)) for a, _ in pairs]
        results = []
        for a, b in pairs:
            self.ask(a, self.test_request(b, probe=probe))
            results.append(PairResult.from_dict(self.answer(a, limit)))
        return results

    def pids(self) -> dict[str, int]:
        return {node: proc.pid for node, proc in self.procs.items()}

    def close(self) -> None:
        for node in list(self._flows):
            self._stop_flows(node)
        for proc in self.procs.values():
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
        for proc in self.procs.values():
            _reap(proc)
        self.procs.clear()
        for ns in self._namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30, check=False)
        self._namespaces.clear()
        subprocess.run(["ip", "link", "del", self._bridge], capture_output=True, timeout=30, check=False)
        shutil.rmtree(self._dir, ignore_errors=True)


@dataclass
class Hunt:
    """One bisection over a fleet: the finding, every result and verdict, and how long it took."""

    finding: Finding
    results: list[PairResult] = field(default_factory=list)
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0


def hunt(
    fleet: NetnsFleet,
    *,
    budget: int | None = None,
    suspects: Sequence[str] = (),
    expect: PairExpectation | None = RIG,
    history: Sequence[PairResult] = (),
    concurrent: bool = False,
    probe: bool = False,
) -> Hunt:
    """Drive a :class:`Bisection` over ``fleet``: each wave run, judged against the baseline, recorded.

    The baselines (bandwidth and round trip) are the medians of ``history`` (earlier results of this
    fleet) and this hunt's results so far; ``expect`` is the profile's expectation (:data:`RIG` by
    default; ``None``: baseline only at the default fraction, as for an unknown profile). ``probe``:
    every test a pingmesh probe, judged on its round trip alone; a slow one is slow as a pair (it
    names neither side) and the bisection pins the node common to the slow pairs.
    """
    started = time.monotonic()
    bisection = Bisection(fleet.nodes, suspects=suspects, budget=budget)
    out = Hunt(finding=bisection.finding())
    while wave := bisection.next_wave():
        results = fleet.wave(wave, concurrent=concurrent, probe=probe)
        out.results.extend(results)
        seen = [*history, *out.results]
        baseline, rtt_baseline = fleet_baseline(seen), fleet_rtt_baseline(seen)
        for (a, b), result in zip(wave, results, strict=True):
            verdict = judge_pair(result, expect, baseline, profile=RIG_PROFILE, rtt_baseline_ms=rtt_baseline)
            out.verdicts.append({"a": a, "b": b, **verdict.as_dict()})
            together = verdict.status == "slow" and not verdict.slow_senders
            failed = verdict.status in ("failed", "skipped")
            bisection.record(a, b, verdict.slow_senders, failed=failed, pair_slow=together)
    out.finding = bisection.finding()
    out.seconds = time.monotonic() - started
    return out


def iter_pairs(nodes: Sequence[str]) -> Iterator[tuple[str, str]]:
    """Disjoint neighbours ``(n0, n1), (n2, n3), ...``: a warm-up wave that seeds the baseline."""
    yield from zip(nodes[0::2], nodes[1::2], strict=False)


def _reap(proc: subprocess.Popen[str]) -> None:
    """Wait for ``proc`` (10 s, then kill it) and close its stdout."""
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    if proc.stdout is not None:
        proc.stdout.close()
