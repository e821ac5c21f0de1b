"""`ftd inject`: a synthetic event reaches the bus as the configured node, through a real broker."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ftd.bus import topics
from ftd.bus.mqtt import MqttBus
from ftd.cli import main
from ftd.events import Event, Kind, decode
from tests.realparts import Mosquitto, free_port


def agent_config(tmp_path: Path, port: int) -> str:
    path = tmp_path / "agent.toml"
    path.write_text(f'[bus]\nhost = "127.0.0.1"\nport = {port}\n\n[agent]\nnode = "node-7"\n')
    return str(path)


@pytest.mark.real
async def test_inject_publishes_as_the_node(
    mosquitto: Mosquitto, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sub = MqttBus(host="127.0.0.1", port=mosquitto.port, client_id="watch", clean_session=True)
    await sub.subscribe(topics.ALL_NODE_EVENTS)
    await sub.start()
    assert await sub.wait_connected(10)
    config = agent_config(tmp_path, mosquitto.port)
    argv = ["inject", "xid", "--config", config, "--data", '{"code": 79, "pci": "0000:3b:00.0"}']
    capsys.readouterr()  # only what the command itself prints counts
    assert await asyncio.to_thread(main, argv) == 0
    printed_id = capsys.readouterr().out.strip()  # the event id, and nothing else

    async def first() -> tuple[str, Event]:
        async for message in sub.messages():
            return message.topic, decode(message.payload, Event)
        raise AssertionError("no message")

    topic, event = await asyncio.wait_for(first(), 10)
    await sub.stop()
    assert topic == topics.node_event("node-7", "xid")
    assert (event.id, event.node, event.kind, event.source) == (printed_id, "node-7", Kind.XID, "inject")
    assert event.data == {"code": 79, "pci": "0000:3b:00.0"} and event.severity == "error"


def test_bad_data_and_unreachable_broker_are_clear_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = agent_config(tmp_path, free_port())  # nothing listens there
    assert main(["inject", "xid", "--config", config, "--data", "[1]"]) == 2
    assert "--data must be a JSON object" in capsys.readouterr().err
    assert main(["inject", "xid", "--config", config, "--data", "{oops"]) == 2
    assert "--data is not JSON" in capsys.readouterr().err
    assert main(["inject", "ecc", "--config", config, "--timeout", "0.5"]) == 2
    assert "could not publish to 127.0.0.1:" in capsys.readouterr().err
