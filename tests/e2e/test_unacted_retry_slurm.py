"""An active critical condition that was never acted on is retried (issue #20 item 6), real Slurm.

Real Slurm (slurmctld + slurmd), real Mosquitto, two ``ftd agent`` processes and a real
``ftd coordinator`` (the fixture of :mod:`tests.e2e.test_reconcile_slurm`, one reconciliation round a
second). The coordinator's ``scontrol`` is a wrapper that fails the first drain it is asked for
(a scheduler outage at the moment of the fault) and runs the real ``scontrol`` for everything else.

The report: an Xid 79 whose drain failed left the node with its active Xid 79, undrained, for good;
nothing retried an active critical condition that was never acted on. After the fix the
reconciler re-proposes the drain through the engine (gate, budgets, approval still apply) on a later
round, with a reason saying it is a retry, and the node is drained.

"The coordinator was down when the event came" is covered too: the agent spools the event until the
coordinator's receipt, so the restarted coordinator decides on it and drains the node on its own.
"""

from __future__ import annotations

import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.daemons import Daemon
from tests.e2e.test_reconcile_slurm import Cluster, agent_config, coordinator_config, wait_until
from tests.realparts import Mosquitto, SlurmCluster, free_port

pytestmark = [pytest.mark.real, pytest.mark.slow]

FAILING_SCONTROL = """#!/bin/bash
# The first "scontrol update ... state=drain" fails as an unreachable slurmctld would; the rest is real.
for arg in "$@"; do
  if [ "$arg" = "state=drain" ] && [ ! -e {marker} ]; then
    touch {marker}
    echo "slurm_update error: Unable to contact slurm controller (connect failure)" >&2
    exit 1
  fi
done
exec {real} "$@"
"""


@pytest.fixture
def cluster(slurm: SlurmCluster, mosquitto: Mosquitto, tmp_path: Path) -> Iterator[Cluster]:
    run_dir = Path(tempfile.mkdtemp(prefix="ftd-unacted-", dir="/tmp"))  # short unix socket paths
    ledger = tmp_path / "ledger.sqlite"
    wrapper = tmp_path / "scontrol"
    real = slurm.run("which", "scontrol").stdout.strip() or "scontrol"
    wrapper.write_text(FAILING_SCONTROL.format(marker=tmp_path / "drain-failed-once", real=real))
    wrapper.chmod(0o755)
    api_port = free_port()
    config = coordinator_config(mosquitto, slurm, ledger, api_port).replace(
        "[coordinator.slurm]\n", f'[coordinator.slurm]\nscontrol = "{wrapper}"\n'
    )
    config = config.replace(
        "reconcile_interval_s = 1.0\n", "reconcile_interval_s = 1.0\nunacted_retry_s = 2.0\n"
    )
    config = config.replace("[coordinator.policy]\n", "[coordinator.policy]\nfailed_retry_s = 1.0\n")
    coordinator = Daemon("coordinator", config, tmp_path)
    agents: dict[str, Daemon] = {}
    kmsg: dict[str, Path] = {}
    sockets: dict[str, str] = {}
    for node in ("node-1", "node-2"):
        kmsg[node] = tmp_path / f"kmsg-{node}"
        kmsg[node].touch()
        state, socket = tmp_path / f"state-{node}", f"{run_dir}/{node}.sock"
        sockets[node] = socket
        agents[node] = Daemon(
            f"agent-{node}", agent_config(mosquitto, node, kmsg[node], state, socket), tmp_path / node
        )
    built = Cluster(
        slurm, mosquitto, coordinator, agents, kmsg, sockets, ledger, tmp_path, f"http://127.0.0.1:{api_port}"
    )
    coordinator.start()
    for agent in agents.values():
        agent.start()
    try:
        for agent in agents.values():
            agent.wait_log("bus_connected")
        wait_until(
            lambda: {r.get("node") for r in built.log_records("node_status")} >= {"node-1", "node-2"},
            30,
            "the coordinator to see both nodes online",
            built,
        )
        yield built
    finally:
        for daemon in (*agents.values(), coordinator):
            daemon.stop()
        for daemon in (coordinator, *agents.values()):
            print(f"----- {daemon.name} log (tail)\n{daemon.log()[-4000:]}")


def test_a_failed_drain_of_an_active_xid79_is_retried_until_the_node_is_drained(cluster: Cluster) -> None:
    cluster.xid79("node-2")
    wait_until(
        lambda: any(a["state"] == "failed" for a in cluster.actions("drain_node", "node-2")),
        30,
        "the first drain of node-2 to fail (the scontrol wrapper)",
        cluster,
    )
    [failed] = cluster.actions("drain_node", "node-2")
    assert "Unable to contact slurm controller" in failed["error"], failed
    assert not cluster.drained("node-2")

    # The node keeps its active Xid 79; a later reconciliation round asks for the drain again.
    wait_until(lambda: cluster.drained("node-2"), 60, "node-2 drained by the retry", cluster)
    wait_until(
        lambda: cluster.actions("drain_node", "node-2")[-1]["state"] == "succeeded",
        20,
        "the retried drain recorded as succeeded",
        cluster,
    )
    drains = cluster.actions("drain_node", "node-2")
    assert [a["state"] for a in drains] == ["failed", "succeeded"], drains
    retry = drains[-1]
    assert retry["reason"].startswith("ftd: retry of an unacted condition: xid 79"), retry
    assert "Reason" in cluster.slurm_node("node-2")
    assert cluster.slurm_node("node-2")["Reason"].startswith("ftd: retry of an unacted condition: xid 79")
    [why] = cluster.log_records("unacted_condition_retried")
    assert why["node"] == "node-2" and why["last_state"] == "failed" and why["attempt"] == 1, why
    assert any("xid 79" in c for c in why["conditions"]), why

    time.sleep(3.0)  # more rounds: drained now, nothing more is asked
    assert len(cluster.actions("drain_node", "node-2")) == 2
    assert len(cluster.log_records("unacted_condition_retried")) == 1


def test_an_xid79_that_came_while_the_coordinator_was_down_is_drained_when_it_is_back(
    cluster: Cluster,
) -> None:
    (cluster.workdir / "drain-failed-once").touch()  # scontrol works throughout here
    assert cluster.coordinator.stop(signal.SIGTERM) is not None
    cluster.xid79("node-2")
    cluster.agents["node-2"].wait_log("condition_active")
    time.sleep(1.0)
    cluster.coordinator.start()
    wait_until(
        lambda: cluster.drained("node-2"), 60, "node-2 drained after the coordinator's return", cluster
    )
    drains = cluster.actions("drain_node", "node-2")
    assert [a["state"] for a in drains][-1:] == ["succeeded"], drains
    assert cluster.slurm_node("node-2")["Reason"].startswith("ftd: xid 79")
