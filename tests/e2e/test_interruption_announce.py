"""An operator's announcement end to end (issue #37): the shipped agent and coordinator on a real
Mosquitto and real Slurm, the README's training loop (the real ftd.client) as a ``--requeue`` batch
job; ``POST /v1/interruptions`` through the real API.

- With time enough (300 s): the job saves (the decision says ``full``), acks, stops and is requeued.
- With the deadline too close for any save (8 s, no save recorded yet: the assumed p95s): the job is
  stopped without a save (``none``) and the action says why.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.shipped_stack import ShippedStack, make_shipped_stack, records, wait_until
from tests.e2e.test_agent_restart_not_death import start_job
from tests.realparts import SlurmCluster, free_port

pytestmark = [pytest.mark.real, pytest.mark.slow]

TOKEN = "e2e-announce-token-0123456789abcdef"


@pytest.fixture
def stack(slurm: SlurmCluster, tmp_path: Path):  # type: ignore[no-untyped-def]
    port = free_port()
    token = tmp_path / "api-token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    api = f'\n[coordinator.api]\nenabled = true\nhost = "127.0.0.1"\nport = {port}\ntoken_file = "{token}"\n'
    with make_shipped_stack(slurm, tmp_path, coordinator_extra=api) as built:
        built.api_url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
        yield built


def call(stack: ShippedStack, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    request = urllib.request.Request(
        stack.api_url + path,  # type: ignore[attr-defined]
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.loads(resp.read())


def announced_action(stack: ShippedStack, job: str, in_s: float) -> dict[str, Any]:
    out = call(stack, "POST", "/v1/interruptions", {"job": job, "in_s": in_s, "reason": "e2e"})
    restarts = [a for a in out["actions"] if a["kind"] == "checkpoint_restart"]
    assert [a["target"] for a in restarts] == [job], out
    action_id = restarts[0]["id"]
    done = ("succeeded", "failed", "escalated")
    wait_until(lambda: call(stack, "GET", f"/v1/actions/{action_id}")["state"] in done, 120, "the action")
    return dict(call(stack, "GET", f"/v1/actions/{action_id}"))


def test_time_enough_saves_acks_and_requeues(stack: ShippedStack) -> None:
    job, log = start_job(stack)
    try:
        action = announced_action(stack, job, 300)
        detail = action["detail"]
        assert detail["deadline_decision"]["choice"] == "full", detail
        assert detail["saved"] and detail["stopped"] is True, detail
        assert records(log, "saved"), "the trainer saved before the deadline"
        jobs = {j["id"]: j for j in call(stack, "GET", "/v1/jobs")}
        assert jobs[job]["save_times"]["default"]["count"] == 1, jobs[job]
    finally:
        stack.slurm.run("scancel", job, check=False)


def test_too_close_stops_without_a_save(stack: ShippedStack) -> None:
    job, log = start_job(stack)
    try:
        before = time.time()
        action = announced_action(stack, job, 8)
        detail = action["detail"]
        assert detail["deadline_decision"]["choice"] == "none", detail
        assert "last verified checkpoint" in detail["save_skipped"]
        assert "saved" not in detail and records(log, "saved") == []
        assert detail["stopped"] is True and detail["stopped_at"] <= before + 8 + 2, detail
    finally:
        stack.slurm.run("scancel", job, check=False)
