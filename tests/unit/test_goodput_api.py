"""The dashboard shows the last goodput run: ``ftd sim goodput --config C`` saves it beside C's ledger,
and that coordinator's API serves it at ``GET /v1/sim/goodput`` (404 until there is one)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.cli import main
from ftd.config import ApiConfig, Config, CoordinatorConfig
from ftd.coordinator.api import Api
from ftd.coordinator.ledger.sqlite import Ledger
from ftd.coordinator.wiring import build

WEB = Path(__file__).resolve().parents[2] / "ftd" / "coordinator" / "api" / "web"


async def _get(ledger_path: Path) -> tuple[int, Any]:
    config = Config(coordinator=CoordinatorConfig(ledger_path=str(ledger_path), scheduler="slurm"))
    bus = MemoryBus(MemoryBroker())
    coordinator = build(config, bus=bus, scheduler=None, ledger=Ledger(":memory:"))
    client: TestClient[Any, Any] = TestClient(TestServer(Api(coordinator, ApiConfig()).app))
    await client.start_server()
    try:
        response = await client.get("/v1/sim/goodput")
        return response.status, await response.json()
    finally:
        await client.close()


def test_the_api_serves_the_run_saved_for_its_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = tmp_path / "state" / "ledger.sqlite"
    ledger.parent.mkdir()
    status, body = asyncio.run(_get(ledger))
    assert status == 404 and "ftd sim goodput --config" in body["error"]

    config = tmp_path / "ftd.toml"
    config.write_text(f'[coordinator]\nledger_path = "{ledger}"\n')
    args = ["sim", "goodput", "--config", str(config), "--days", "2", "--seeds", "1", "--no-sweep"]
    assert main([*args, "--json", "--no-entry-points"]) == 0
    printed = json.loads(capsys.readouterr().out.splitlines()[-1])  # after the coordinator's logs
    assert (ledger.parent / "goodput-last.json").exists()

    status, body = asyncio.run(_get(ledger))  # the CLI runs its own event loops: no test loop here
    assert status == 200
    assert body == printed
    assert body["config"] == str(config)
    assert set(body["policies"]) == {"no_ftd", "ftd"}


async def test_a_damaged_file_is_a_404_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / "goodput-last.json").write_text("{not json")
    assert (await _get(tmp_path / "ledger.sqlite"))[0] == 404
    (tmp_path / "goodput-last.json").write_text("[1, 2]")
    assert (await _get(tmp_path / "ledger.sqlite"))[0] == 404


def test_the_dashboard_asks_for_it() -> None:
    assert "/v1/sim/goodput" in (WEB / "app.js").read_text()
    assert 'id="goodput"' in (WEB / "index.html").read_text()
