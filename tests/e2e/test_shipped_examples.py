"""The shipped example configs, installed as docs/operators.md §1 says, come up on the shipped broker.

What: Mosquitto with deploy/mosquitto's config, ACL and mutual-TLS listener (certificates from
``scripts/make-certs.sh``, :mod:`tests.e2e.tls_broker`); ``examples/config/agent.toml`` and
``coordinator.toml`` with only the documented edits (:mod:`tests.e2e.shipped_configs`: broker,
certificates, node, paths; the rules installed beside the config); the documented steps around them
(the ``ftd-trainers`` group, the API token as the unit's credential ``api-token`` in
``$CREDENTIALS_DIRECTORY``); ``ftd check-config`` passes on both as installed; then both daemons
start and are seen up from outside: the coordinator's ``/healthz`` answers with the bus connected,
its ``/v1/nodes`` has the node online, and the agent's retained status on the broker says
``online`` (read with the ACL's read-only ``coordinator-standby`` login, so neither daemon's session
is touched).

Why: the examples are what an operator copies; when they disagree with the units, the broker or each
other, the daemons stop after ``check-config`` said OK (issue #21). About 5 s on a session's Slurm.
"""

from __future__ import annotations

import asyncio
import grp
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
import urllib.request
from pathlib import Path

import pytest

from ftd.bus.mqtt import MqttBus
from tests.e2e import shipped_configs
from tests.e2e.daemons import REPO, Daemon
from tests.e2e.operator_stack import wait_for
from tests.e2e.tls_broker import tls_broker
from tests.realparts import SlurmCluster, free_port, require_binary
from tests.security.bus import Inbox

pytestmark = [pytest.mark.real, pytest.mark.slow]

STANDBY_PASSWORD = "pw-standby-view"


def documented_group() -> str:
    """``sudo groupadd --system ftd-trainers`` (operators.md §1), when the group is not there yet."""
    group = tomllib.loads((shipped_configs.EXAMPLES / "agent.toml").read_text())["agent"]["socket_group"]
    try:
        grp.getgrnam(group)
    except KeyError:
        if os.geteuid() != 0:
            pytest.skip(f"creating the group {group} needs root")
        groupadd = require_binary("groupadd", package="passwd")
        subprocess.run([groupadd, "--system", group], check=True, capture_output=True, timeout=30)
    return str(group)


def check_config(path: Path, env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ftd.cli", "check-config", str(path)],
        capture_output=True, text=True, timeout=60, cwd=REPO, env={**os.environ, **env},
    )  # fmt: skip
    assert done.returncode == 0, f"check-config {path}:\n{done.stdout}{done.stderr}"


async def retained_status(port: int, node: str) -> dict[str, object]:
    bus = MqttBus(
        host="127.0.0.1", port=port, client_id="coordinator-standby", username="coordinator-standby",
        password=STANDBY_PASSWORD, clean_session=True, keepalive_s=5, reconnect_max_s=1.0,
    )  # fmt: skip
    topic = f"ftd/v1/nodes/{node}/status"
    inbox = await Inbox(bus).start(topic)
    try:
        await inbox.wait(lambda: bool(inbox.on(topic)), 20, f"{node}'s retained status")
        message = inbox.on(topic)[-1]
        assert message.retain
        return dict(json.loads(message.payload))
    finally:
        await inbox.close()


def test_the_examples_come_up_with_only_the_documented_edits(slurm: SlurmCluster, tmp_path: Path) -> None:
    group = documented_group()
    run_dir = Path(tempfile.mkdtemp(prefix="ftd-ex-", dir="/tmp"))  # unix socket paths must be short
    daemons: list[Daemon] = []
    try:
        users = {"coordinator-standby": STANDBY_PASSWORD}
        with tls_broker(tmp_path / "pki", ["node-1", "coordinator"], users=users) as tls:
            etc = tmp_path / "etc"
            rules = etc / "rules" / "python"  # sudo install -D -t /etc/ftd/rules/python rules/python/*.py
            rules.mkdir(parents=True)
            for rule in (REPO / "rules" / "python").glob("*.py"):
                shutil.copy(rule, rules / rule.name)
            creds = tmp_path / "credentials"  # what the unit's LoadCredential=api-token:... fills
            creds.mkdir()
            (creds / "api-token").write_text("example-token\n")
            api_port = free_port()
            cert, key = tls.cert("coordinator")
            coordinator = Daemon(
                "coordinator",
                shipped_configs.coordinator_config(
                    port=tls.tls_port, ca=tls.ca, cert=cert, key=key, ledger=tmp_path / "ledger.sqlite",
                    slurm_conf=slurm.conf_path, api_port=api_port, save_deadline_s=30.0,
                    stop_deadline_s=30.0, rule_dirs=rules,
                ),
                etc,
                env={"CREDENTIALS_DIRECTORY": str(creds), "SLURM_CONF": str(slurm.conf_path)},
            )  # fmt: skip
            kmsg = tmp_path / "kmsg"
            kmsg.touch()
            cert, key = tls.cert("node-1")
            agent = Daemon(
                "agent-node-1",
                shipped_configs.agent_config(
                    node="node-1", port=tls.tls_port, ca=tls.ca, cert=cert, key=key, kmsg=kmsg,
                    state_dir=tmp_path / "state", socket_path=run_dir / "agent.sock",
                    socket_group=group, heartbeat_timeout_s=60.0,
                ),
                etc,
            )  # fmt: skip
            for daemon in (coordinator, agent):
                etc.mkdir(parents=True, exist_ok=True)
                installed = etc / f"{daemon.name}.toml"
                installed.write_text(daemon.config_text)
                check_config(installed, daemon.env or {})
            for daemon in (coordinator, agent):
                daemons.append(daemon.start())
            coordinator.wait_log("bus_connected", 60)
            agent.wait_log("bus_connected", 60)

            base = f"http://127.0.0.1:{api_port}"
            with urllib.request.urlopen(f"{base}/healthz", timeout=10) as resp:
                health = json.loads(resp.read())
            assert resp.status == 200 and health.get("bus_connected") is True, health
            status = asyncio.run(retained_status(tls.broker.port, "node-1"))
            assert status["node"] == "node-1" and status["state"] == "online", status

            def node_online() -> bool:
                with urllib.request.urlopen(f"{base}/v1/nodes", timeout=10) as resp:
                    listed = json.loads(resp.read())
                nodes = listed.get("nodes", listed) if isinstance(listed, dict) else listed
                return any(n.get("name") == "node-1" and n.get("online") is True for n in nodes)

            assert wait_for(node_online, 30), "the coordinator never listed node-1 online"
            assert Path(run_dir / "agent.sock").stat().st_gid == grp.getgrnam(group).gr_gid
    finally:
        for daemon in daemons:
            daemon.stop()
        for daemon in daemons:
            print(f"----- {daemon.name} log (tail)\n{daemon.log()[-4000:]}")
        shutil.rmtree(run_dir, ignore_errors=True)
