"""Checkpoints verified before they count (issue #34), on real parts.

Real Mosquitto, real Slurm, ``ftd agent`` and ``ftd coordinator`` subprocesses (:mod:`tests.e2e.stack`).
Two ranks of one job talk to the agent's socket through the plain client (:class:`ftd.client.Client`:
``report_checkpoint``), writing real shards and manifests (:mod:`ftd.client.manifest`) as any trainer
may, without the checkpoint tier. Step 100 is whole on both ranks; step 200's shard of rank 1 has a
flipped byte; hostile manifests (a path out of the checkpoint directory, a link to a file elsewhere,
a huge manifest, a truncated shard) are reported too. The agent must verify each off its event loop and
publish one ``checkpoint`` event with the reason, never follow or crash; the coordinator's catalogue
must hold step 100 as the newest checkpoint verified on every rank (``/v1/jobs``), which is what a
restart resumes from, and the ledger must keep why step 200 did not count.
"""

from __future__ import annotations

import json
import os
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ftd.bench.slurm_cluster import free_port
from ftd.client import Client
from ftd.client import manifest as mf
from tests.e2e.stack import Stack, make_stack, wait_until
from tests.realparts import Mosquitto, SlurmCluster

pytestmark = [pytest.mark.real, pytest.mark.slow]

JOB = "ck1"
WITHIN = 90.0


@pytest.fixture
def api_stack(slurm: SlurmCluster, mosquitto: Mosquitto, tmp_path: Path) -> Iterator[tuple[Stack, int]]:
    token = tmp_path / "api.token"
    token.write_text("ck-token\n")
    port = free_port()
    api = f'\n[coordinator.api]\nport = {port}\ntoken_file = "{token}"\n'
    # The ranks run in this test's process, not in a Slurm job: the coordinator's placement check
    # (presence only from nodes the scheduler runs the job on) is the documented setting turned off.
    api += "\n[coordinator.placement]\nenforce = false\n"
    with make_stack(slurm, mosquitto, tmp_path, coordinator_extra=api) as built:
        yield built, port


def shard(root: Path, step: int, rank: int, payload: bytes) -> str:
    """One rank's shard and its manifest under ``root/step-.../``; returns the manifest's path."""
    step_dir = root / f"step-{step:09d}"
    (step_dir / f"rank-{rank:05d}").mkdir(parents=True, exist_ok=True)
    rel = f"rank-{rank:05d}/state.bin"
    (step_dir / rel).write_bytes(payload)
    manifest = mf.Manifest(
        job=JOB,
        step=step,
        rank=rank,
        world_size=2,
        generation=0,
        level="local",
        created=1.0,
        save_s=0.25,
        files=(mf.file_entry(str(step_dir), rel),),
    )
    return mf.write(str(step_dir), manifest)


def hostile(root: Path, step: int, entry: dict[str, Any]) -> str:
    """A manifest for rank 0 of ``step`` naming ``entry`` (written by hand: the writer refuses it)."""
    step_dir = root / f"step-{step:09d}"
    step_dir.mkdir(parents=True, exist_ok=True)
    body = {
        "format": mf.FORMAT,
        "job": JOB,
        "step": step,
        "rank": 0,
        "world_size": 2,
        "generation": 0,
        "level": "local",
        "created": 1.0,
        "save_s": None,
        "files": [entry],
    }
    path = step_dir / mf.manifest_name(0)
    path.write_text(json.dumps(body))
    return str(path)


def jobs(port: int) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/jobs", timeout=10) as answer:
        body = json.loads(answer.read())
    return body if isinstance(body, list) else list(body.get("jobs", []))


def test_a_corrupt_shard_and_hostile_manifests_are_rejected_and_the_previous_step_counts(
    api_stack: tuple[Stack, int], tmp_path: Path
) -> None:
    stack, port = api_stack
    root = tmp_path / "ckpt"
    ranks = [Client(job=JOB, rank=r, socket_path=stack.socket, heartbeat_interval=0.2) for r in (0, 1)]
    try:
        stack.wait_registered(JOB, timeout=WITHIN)
        for client in ranks:
            client.heartbeat(step=1)
        for step in (100, 200):
            for rank in (0, 1):
                path = shard(root, step, rank, bytes([rank, step % 256]) * 8192)
                if step == 200 and rank == 1:  # a flipped byte after the manifest was written
                    state = root / f"step-{step:09d}" / "rank-00001" / "state.bin"
                    data = bytearray(state.read_bytes())
                    data[100] ^= 0xFF
                    state.write_bytes(bytes(data))
                assert ranks[rank].report_checkpoint(step, path, world_size=2, save_s=0.25) == path

        def events() -> dict[tuple[int, int], dict[str, Any]]:
            out = {}
            for body in stack.ledger_events("checkpoint"):
                data = body["data"]
                assert isinstance(data, dict)
                out[(int(data["step"]), int(data["rank"]))] = data
            return out

        # Hostile reports from rank 0, each at its own step.
        outside = hostile(root, 310, {"path": "../../../etc/passwd", "size": 1, "sha256": "0" * 64})
        huge = str(root / "step-000000320" / mf.manifest_name(0))
        os.makedirs(os.path.dirname(huge))
        Path(huge).write_bytes(b" " * (mf.MAX_MANIFEST_BYTES + 1))
        linked = str(root / "step-000000330" / mf.manifest_name(0))
        os.makedirs(os.path.dirname(linked))
        os.symlink(str(tmp_path / "elsewhere.json"), linked)
        (tmp_path / "elsewhere.json").write_text(Path(shard(root, 329, 0, b"x" * 64)).read_text())
        truncated = shard(root, 340, 0, b"t" * 4096)
        os.truncate(root / "step-000000340" / "rank-00000" / "state.bin", 100)
        # The client refuses to report these; a rank not using it can still send them: raw lines.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
            raw.settimeout(30)
            raw.connect(stack.socket)
            raw.sendall(json.dumps({"v": 1, "op": "register", "job": JOB, "rank": 0}).encode() + b"\n")
            assert b'"ok"' in raw.recv(65536)
            for step, path in ((310, outside), (320, huge), (330, linked), (340, truncated)):
                line = {"v": 1, "op": "checkpoint", "step": step, "manifest": path, "level": "local"}
                raw.sendall(json.dumps(line).encode() + b"\n")
            wanted_raw = {(s, 0) for s in (310, 320, 330, 340)}
            wait_until(lambda: wanted_raw <= set(events()), WITHIN, "the hostile reports' events")

        wanted = {(100, 0), (100, 1), (200, 0), (200, 1), (310, 0), (320, 0), (330, 0), (340, 0)}
        wait_until(lambda: wanted <= set(events()), WITHIN, "a checkpoint event for every report")
        got = events()
        assert all(got[(100, r)]["ok"] is True for r in (0, 1)), got
        assert got[(200, 0)]["ok"] is True, got
        assert got[(200, 1)]["ok"] is False and "SHA-256" in str(got[(200, 1)]["reason"]), got
        assert got[(310, 0)]["ok"] is False and "checkpoint directory" in str(got[(310, 0)]["reason"]), got
        assert got[(320, 0)]["ok"] is False and "bytes (at most" in str(got[(320, 0)]["reason"]), got
        assert got[(330, 0)]["ok"] is False and got[(330, 0)]["reason"], got
        assert got[(340, 0)]["ok"] is False and "is 100 bytes" in str(got[(340, 0)]["reason"]), got

        def newest_local() -> Any:
            job = next((j for j in jobs(port) if j.get("id") == JOB), None)
            return job and job.get("checkpoints", {}).get("local", {}).get("step")

        wait_until(lambda: newest_local() == 100, WITHIN, "/v1/jobs to show step 100 as newest verified")
        log = stack.agent.log()
        assert "Traceback" not in log and "local_api_checkpoint" in log
    finally:
        for client in ranks:
            client.close()
