"""A real Prometheus scrapes a real coordinator and agent and fires ftd's alerts.

Two conditions an on-call must hear about, made for real: an action that hangs (slurmctld is
SIGSTOPped, so the drain's ``scontrol`` call cannot return: the action runs past
``coordinator.stuck_after_s``) and a lost bus (the broker is stopped). Prometheus (Debian's
package, started here on free ports with 1 s scrape and evaluation intervals) loads the shipped
rules from deploy/prometheus/ftd-alerts.yml with their ``for:`` holds removed (the holds themselves
are checked by ``promtool test rules``, tests/unit/test_prometheus_rules.py): each alert must fire
within a few evaluation intervals of its condition. The figures are printed, not asserted tightly.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.daemons import REPO
from tests.e2e.stack import make_stack, wait_until
from tests.realparts import Mosquitto, SlurmCluster, free_port, require_binary, wait_port

pytestmark = [pytest.mark.real, pytest.mark.slow]

RULES = REPO / "deploy" / "prometheus" / "ftd-alerts.yml"
TOKEN = "prometheus-test-token"


def rules_without_holds(dest: Path) -> Path:
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("for", None)
    dest.write_text(yaml.safe_dump(doc))
    return dest


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.load(resp)


def firing(prom: str) -> set[str]:
    alerts = get_json(f"{prom}/api/v1/alerts")["data"]["alerts"]
    return {a["labels"]["alertname"] for a in alerts if a["state"] == "firing"}


def post(url: str, body: dict[str, Any]) -> int:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status


def test_prometheus_fires_stuck_action_and_bus_lost(
    slurm: SlurmCluster, mosquitto: Mosquitto, tmp_path: Path
) -> None:
    prometheus = require_binary("prometheus", package="prometheus")
    api_port, agent_port, prom_port = free_port(), free_port(), free_port()
    (tmp_path / "token").write_text(TOKEN)
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(rules_without_holds(tmp_path / "rules.yml"))],
                "scrape_configs": [
                    {
                        "job_name": "ftd-coordinator",
                        "static_configs": [{"targets": [f"127.0.0.1:{api_port}"]}],
                    },
                    {"job_name": "ftd-agent", "static_configs": [{"targets": [f"127.0.0.1:{agent_port}"]}]},
                ],
            }
        )
    )
    with make_stack(
        slurm,
        mosquitto,
        tmp_path,
        coordinator_keys="stuck_after_s = 2",
        coordinator_extra=f'[coordinator.api]\nport = {api_port}\ntoken_file = "{tmp_path / "token"}"\n',
        agent_extra=f"[agent.metrics]\nport = {agent_port}\n",
    ):
        log = (tmp_path / "prometheus.log").open("ab")
        prom = subprocess.Popen(
            [
                prometheus,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
            stdout=log,
            stderr=log,
        )
        ctld_pid = int((slurm.workdir / "slurmctld.pid").read_text())
        url = f"http://127.0.0.1:{prom_port}"
        try:
            wait_port(prom_port, 30)

            def ready() -> bool:
                try:
                    with urllib.request.urlopen(f"{url}/-/ready", timeout=5) as resp:
                        return resp.status == 200
                except OSError:  # 503 while its storage starts
                    return False

            wait_until(ready, 30, "Prometheus ready")

            def both_up() -> bool:
                result = get_json(f"{url}/api/v1/query?query=up")["data"]["result"]
                return {r["metric"]["job"] for r in result if r["value"][1] == "1"} == {
                    "ftd-coordinator",
                    "ftd-agent",
                }

            wait_until(both_up, 30, "Prometheus scraping the coordinator and the agent")
            assert not firing(url) & {"FtdActionStuck", "FtdBusDisconnected"}

            # A drain that cannot finish: the scheduler's controller does not answer.
            os.kill(ctld_pid, signal.SIGSTOP)
            try:
                assert post(f"http://127.0.0.1:{api_port}/v1/nodes/node-1/drain", {"reason": "test"}) == 202
                stuck_at = time.monotonic() + 2  # coordinator.stuck_after_s
                wait_until(lambda: "FtdActionStuck" in firing(url), 30, "FtdActionStuck firing")
                print(
                    f"FtdActionStuck fired {time.monotonic() - stuck_at:.1f} s after the action became stuck"
                )
            finally:
                os.kill(ctld_pid, signal.SIGCONT)

            # The broker goes away: the coordinator's bus is lost.
            mosquitto.stop()
            lost_at = time.monotonic()
            wait_until(lambda: "FtdBusDisconnected" in firing(url), 30, "FtdBusDisconnected firing")
            print(f"FtdBusDisconnected fired {time.monotonic() - lost_at:.1f} s after the broker stopped")
        finally:
            prom.terminate()
            prom.wait(10)
            log.close()
