"""The cases of ``ftd bench preemption`` that need ftd's daemons: a cloud notice and a maintenance
reservation, each announcing an interruption that the coordinator turns into a save before it.

What: :func:`stack_cases` starts a private one-node Slurm (:class:`MultiNodeSlurm`), Mosquitto, the
node's agent (its cloud watcher polling a loopback AWS IMDSv2 server, :class:`MetadataServer`, the
one simulated part) and the coordinator (Slurm interruptions polled every second), then runs a DDP
job (one gloo rank under ``ftd run``, :mod:`ftd.bench.recovery_trainer` saving through the
checkpoint tier every 10 steps, so its save-time model is measured before any notice) per case:

* ``cloud``: the metadata server starts answering a spot ``instance-action`` two minutes ahead. The
  figure is the seconds from the notice appearing to the rank starting the save the coordinator asked
  for (``notice_to_save_s``: the directive left the coordinator before that), and the decision.
* ``maintenance``: ``scontrol create reservation`` with ``Flags=MAINT`` on the job's node, starting
  ``lead_s`` later. The figures are the decision, the save's end before the reservation's start
  (``margin_s``) and whether the job was requeued.

Why the real daemons: both notices reach the job only through them (the agent's poller, the
coordinator's ``scontrol show reservation`` and its decision against the save-time model).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from ftd.bench.broker import PrivateMosquitto
from ftd.bench.recovery_stack import JobSpec, RecoveryStack, recovery_stack, wait_for
from ftd.bench.slurm_multinode import MultiNodeSlurm

__all__ = ["MetadataServer", "stack_cases"]

SPOT_PATH = "/latest/meta-data/spot/instance-action"
_DONE = ("succeeded", "failed", "escalated")


class MetadataServer:
    """A loopback AWS IMDSv2: a token on ``PUT /latest/api/token``; the spot notice 404 until
    :meth:`announce` (then the documented JSON body), every other path 404."""

    def __init__(self) -> None:
        self.notice: bytes | None = None
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:
                self._answer(200, b"bench-token" if self.path == "/latest/api/token" else b"")

            def do_GET(self) -> None:
                body = server.notice if self.path == SPOT_PATH else None
                self._answer(200 if body else 404, body or b"")

            def _answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        self._thread = threading.Thread(target=self._http.serve_forever, name="bench-imds", daemon=True)

    def __enter__(self) -> MetadataServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.shutdown()
        self._http.server_close()

    def announce(self, in_s: float) -> float:
        """Serve a spot ``terminate`` notice for ``in_s`` seconds from now; returns its deadline."""
        deadline = float(int(time.time() + in_s))
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(deadline))
        self.notice = json.dumps({"action": "terminate", "time": when}).encode()
        return deadline

    def clear(self) -> None:
        self.notice = None


def _job(stack: RecoveryStack, name: str) -> str:
    env = {"FTD_RECOVERY_TIER": "1", "FTD_RECOVERY_SAVE_EVERY": "10", "FTD_RECOVERY_MAX_S": "600"}
    job = stack.submit(JobSpec(name=name, nodes=1, spares=0, warm="", step_s=0.05, env=env))

    def periodic() -> list[dict[str, Any]]:
        return [r for r in stack.records(job, "save_started") if r.get("periodic")]

    wait_for(lambda: len(periodic()) >= 3, 240, "three periodic saves (the save-time model)")
    time.sleep(1.0)  # their checkpoint events reach the coordinator
    return job


def _restart(stack: RecoveryStack, job: str, timeout: float) -> dict[str, Any]:
    wait_for(
        lambda: (a := stack.action("checkpoint_restart", job)) is not None and a["state"] in _DONE,
        timeout,
        "the interruption's checkpoint_restart to end",
    )
    action = stack.action("checkpoint_restart", job)
    assert action is not None
    return action


def _asked_saves(stack: RecoveryStack, job: str, after: float) -> list[dict[str, Any]]:
    return [r for r in stack.records(job, "save_started") if not r.get("periodic") and r["t"] >= after]


def _cloud(stack: RecoveryStack, imds: MetadataServer) -> dict[str, Any]:
    job = _job(stack, "ftd-bench-cloud")
    appeared = time.time()
    deadline = imds.announce(120.0)
    try:
        wait_for(lambda: _asked_saves(stack, job, appeared), 30, "the save the notice asked for")
        started = _asked_saves(stack, job, appeared)[0]["t"]
        action = _restart(stack, job, 150)
    finally:
        imds.clear()
        stack.slurm.run("scancel", job, check=False)
    decision = action["detail"].get("deadline_decision", {})
    saved = [r for r in stack.records(job, "saved") if not r.get("periodic") and r["t"] >= appeared]
    return {
        "job": job,
        "deadline": deadline,
        "notice_to_save_s": round(started - appeared, 3),
        "decision": decision.get("choice"),
        "p95_s": decision.get("p95_s"),
        "assumed": decision.get("assumed"),
        "saved_before_deadline": bool(saved) and saved[-1]["t"] < deadline,
        "action_state": action["state"],
    }


def _maintenance(stack: RecoveryStack, lead_s: float) -> dict[str, Any]:
    job = _job(stack, "ftd-bench-maint")
    start = float(int(time.time() + lead_s))
    created = time.time()
    stack.slurm.run(
        "scontrol", "create", "reservation", "ReservationName=ftd-bench-maint",
        "StartTime=" + time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(start)),
        "Duration=2", "Nodes=node-1", "Users=root", "Flags=MAINT,IGNORE_JOBS",
    )  # fmt: skip
    try:
        action = _restart(stack, job, lead_s + 60)
    finally:
        stack.slurm.run("scancel", job, check=False)
        stack.slurm.run("scontrol", "delete", "ReservationName=ftd-bench-maint", check=False)
    decision = action["detail"].get("deadline_decision", {})
    saved = [r for r in stack.records(job, "saved") if not r.get("periodic") and r["t"] >= created]
    return {
        "job": job,
        "deadline": start,
        "decision": decision.get("choice"),
        "p95_s": decision.get("p95_s"),
        "assumed": decision.get("assumed"),
        "saved": bool(saved),
        "margin_s": round(start - saved[-1]["t"], 3) if saved else None,
        "saved_before_deadline": bool(saved) and saved[-1]["t"] < start,
        "requeued": action["detail"].get("requeued") is not None,
        "action_state": action["state"],
    }


@contextlib.contextmanager
def _stack(work: Path, imds: MetadataServer) -> Iterator[RecoveryStack]:
    slurm = MultiNodeSlurm(work / "slurm", nodes=1).start()
    try:
        agent = f'\n[agent.cloud]\naws = true\naws_url = "{imds.url}"\ninterval_s = 0.5\ntimeout_s = 1.0\n'
        coordinator = "\n[coordinator.slurm.interruptions]\ninterval_s = 1.0\n"
        with (
            PrivateMosquitto() as broker,
            recovery_stack(
                slurm, broker.port, work / "stack", agent_extra=agent, coordinator_extra=coordinator
            ) as stack,
        ):
            yield stack
    finally:
        slurm.stop()


def stack_cases(work: Path, cases: list[str], runs: int, lead_s: float = 60.0) -> dict[str, Any]:
    """``runs`` runs of each of ``cases`` (``cloud``, ``maintenance``) on one stack."""
    out: dict[str, Any] = {}
    with MetadataServer() as imds, _stack(work, imds) as stack:
        for case in cases:
            results = []
            for _ in range(runs):
                try:
                    results.append(_cloud(stack, imds) if case == "cloud" else _maintenance(stack, lead_s))
                except (TimeoutError, AssertionError, RuntimeError) as err:
                    results.append({"error": str(err)[:500], "logs": stack.logs(3000)[-3000:]})
            out[case] = {"runs": len(results), "results": results}
    for name in ("cloud", "maintenance"):
        if name in out:
            rs = out[name]["results"]
            out[name]["saved_before_deadline"] = sum(1 for r in rs if r.get("saved_before_deadline"))
    if "cloud" in out:
        delays = [r["notice_to_save_s"] for r in out["cloud"]["results"] if "notice_to_save_s" in r]
        out["cloud"]["notice_to_save_max_s"] = max(delays) if len(delays) == out["cloud"]["runs"] else None
    return out
