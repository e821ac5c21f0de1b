"""The agent's pair-test service (ftd/agent/pair_tests/service.py): key, health, training check.

An agent built by the real wiring carries the service; with no key file configured it serves nothing
and is idle with the reason, with a key file it cannot read it is unavailable with the reason, with a
key it answers a peer's test; a node with a job registered or reported by the Prolog refuses tests.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

from ftd.agent.pair_tests.client import PairPeer, run_pair_test
from ftd.agent.pair_tests.server import PairTestServer
from ftd.agent.pair_tests.service import PairTestService, read_key, training
from ftd.agent.wiring import build_agent
from ftd.bus.memory import MemoryBroker, MemoryBus
from ftd.config import AgentConfig, Config
from ftd.config.schema import PairTestsConfig
from ftd.events import NODE_RANK, Directive, Kind, Severity
from ftd.fabric.pairs import PairResult


def test_the_wired_agent_runs_the_pair_test_service() -> None:
    cfg = AgentConfig()
    agent = build_agent(cfg, bus=MemoryBus(MemoryBroker(), client_id="agent"), node="n1")
    assert any(getattr(w, "name", "") == "pair_tests" for w in agent.watchers)


def test_a_missing_key_is_a_reason_never_a_server(tmp_path: Path) -> None:
    assert read_key("") == (None, "agent.pair_tests.key_file is not set")
    key, why = read_key(str(tmp_path / "absent"))
    assert key is None and "cannot read" in why
    (tmp_path / "empty").write_text("\n")
    assert read_key(str(tmp_path / "empty"))[1].endswith("is empty")

    async def health_after_start(cfg: PairTestsConfig) -> tuple[str, str, object]:
        service = PairTestService(cfg, "n1", busy=lambda: None, host="127.0.0.1")
        task = asyncio.create_task(service.run())
        await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return service.health().state, service.health().reason, service.server

    state, reason, server = asyncio.run(health_after_start(PairTestsConfig()))
    assert (state, server) == ("idle", None) and "not set" in reason
    state, reason, server = asyncio.run(
        health_after_start(PairTestsConfig(key_file=str(tmp_path / "absent")))
    )
    assert (state, server) == ("unavailable", None) and "cannot read" in reason


def test_with_a_key_the_service_answers_and_refuses_while_training(tmp_path: Path) -> None:
    (tmp_path / "key").write_text("k3y\n")
    jobs: dict[str, object] = {}

    async def main() -> tuple[str, str]:
        cfg = PairTestsConfig(key_file=str(tmp_path / "key"), port=_free_port())
        service = PairTestService(cfg, "n1", busy=training(lambda: {}, lambda: jobs), host="127.0.0.1")
        task = asyncio.create_task(service.run())
        await asyncio.wait_for(service.listening.wait(), 30)
        peer = PairPeer("n1", "127.0.0.1", service.cfg.port)
        ok = await run_pair_test(peer, node="n2", key=b"k3y", max_bytes=1 << 20)
        jobs["42"] = object()
        refused = await run_pair_test(peer, node="n2", key=b"k3y", max_bytes=1 << 20)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return ok.error, refused.error

    ok, refused = asyncio.run(main())
    assert ok == "" and "n1: training (job 42)" in refused


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_pair_test_directive_is_run_recorded_and_answered(tmp_path: Path) -> None:
    (tmp_path / "key").write_text("k3y")
    jobs: dict[str, object] = {}

    async def main() -> list[tuple[object, object]]:
        server = PairTestServer(node="n2", key=b"k3y", host="127.0.0.1")
        port = await server.start()
        cfg = PairTestsConfig(key_file=str(tmp_path / "key"), max_bytes=1 << 20)
        service = PairTestService(cfg, "n1", busy=training(lambda: {}, lambda: jobs))
        params = {"peer": "n2", "host": "127.0.0.1", "port": port, "max_bytes": 1 << 30}
        out = [await service.on_directive(_directive(params))]
        out.append(await service.on_directive(_directive({"peer": "n2", "host": 5})))
        jobs["7"] = object()
        out.append(await service.on_directive(_directive(params)))
        await server.close()
        return out

    (ok_event, ok_ack), (bad_event, bad_ack), (busy_event, busy_ack) = asyncio.run(main())
    assert (
        ok_event.kind == Kind.PAIR_TEST and ok_event.data["a_to_b_gbps"] > 0 and ok_event.data["error"] == ""
    )
    assert ok_event.data["bytes_moved"] <= 2 << 20, "the agent's own cap, not the directive's ask"
    assert ok_ack.ok and ok_ack.rank == NODE_RANK and ok_ack.data["pair_test"]["b"] == "n2"
    assert not bad_ack.ok and bad_event.data["error"] == "malformed pair_test directive"
    assert not busy_ack.ok and busy_event.data["error"] == "n1: training (job 7)"
    assert busy_event.severity == Severity.WARNING


def _directive(params: dict[str, object]) -> Directive:
    return Directive(id="d1", ts=0.0, action="pair_test", node="n1", params=params)


def test_check_config_reports_an_unreadable_pair_test_key(tmp_path: Path) -> None:
    from ftd.commands.config_check.references import check_references

    def key_problems(config: Config) -> list[str]:
        problems = check_references(config, roles=["agent"])
        return [p.message for p in problems if p.path == "agent.pair_tests.key_file"]

    absent = str(tmp_path / "absent")
    found = key_problems(Config(agent=AgentConfig(pair_tests=PairTestsConfig(key_file=absent))))
    assert len(found) == 1 and "cannot read" in found[0]
    (tmp_path / "key").write_text("k3y\n")
    assert (
        key_problems(Config(agent=AgentConfig(pair_tests=PairTestsConfig(key_file=str(tmp_path / "key")))))
        == []
    )
    assert key_problems(Config()) == []


def test_a_zero_byte_directive_is_a_pingmesh_probe(tmp_path: Path) -> None:
    (tmp_path / "key").write_text("k3y")

    async def main() -> tuple[Any, Any]:
        server = PairTestServer(node="n2", key=b"k3y", host="127.0.0.1")
        port = await server.start()
        service = PairTestService(PairTestsConfig(key_file=str(tmp_path / "key")), "n1", busy=lambda: None)
        params = {"peer": "n2", "host": "127.0.0.1", "port": port, "max_bytes": 0, "timeout_s": 2.0}
        try:
            return await service.on_directive(_directive(params))
        finally:
            await server.close()

    event, ack = asyncio.run(main())
    result = PairResult.from_dict(event.data)
    assert ack.ok and result.probe and result.rtt_ms is not None and result.bytes_moved == 0


def test_the_burn_in_pair_step_tests_the_peer_the_coordinator_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #36 item 4's pair step through issue #35's pair tests: the burn-in directive names a
    known-good peer; the agent's NodeHooks tests it with its own service and judges it like any pair
    test (the profile's pair.toml, the fleet's baseline). No peer, or pair tests off: no step (the
    burn-in says the step was skipped); an expected bandwidth the pair cannot reach: the step fails."""
    from types import SimpleNamespace

    import ftd.catalog.hardware_profiles as profiles
    from ftd.agent.hooks import NodeHooks

    (tmp_path / "key").write_text("k3y")
    site = tmp_path / "site.toml"  # a profile whose pairs must reach 100 Tbit/s: loopback cannot
    site.write_text('[profiles.huge]\ngpu_names = ["HUGE"]\n[pair.huge]\nexpected_gbps = 100000.0\n')
    catalog = profiles.load_hardware_catalog(site)
    monkeypatch.setattr(profiles, "load_hardware_catalog", lambda overrides=None: catalog)

    async def main() -> list[Any]:
        server = PairTestServer(node="good", key=b"k3y", host="127.0.0.1")
        port = await server.start()
        cfg = PairTestsConfig(key_file=str(tmp_path / "key"), max_bytes=1 << 20)
        hooks = SimpleNamespace(pair_tests=PairTestService(cfg, "new", busy=lambda: None))
        peer = {"node": "good", "host": "127.0.0.1", "port": port}
        fleet = {"pair_peer": peer, "pair_baseline_gbps": 0.001, "pair_rtt_baseline_ms": 0.05}
        step = NodeHooks._pair_step(hooks, fleet, None)  # type: ignore[arg-type]
        assert step is not None
        passed = await step()
        slow = await NodeHooks._pair_step(hooks, {"pair_peer": peer}, "huge")()  # type: ignore[arg-type, misc]
        none = [
            NodeHooks._pair_step(hooks, {}, None),  # type: ignore[arg-type]
            NodeHooks._pair_step(SimpleNamespace(pair_tests=None), {"pair_peer": peer}, None),  # type: ignore[arg-type]
        ]
        await server.close()
        return [passed, slow, none]

    passed, slow, none = asyncio.run(main())
    assert passed.name == "pair" and passed.status == "pass", passed
    assert passed.figures["peer"] == "good" and passed.figures["a_to_b_gbps"] > 0
    # its round trip judged against the fleet's RTT baseline the coordinator sent (10 x, >= 1 ms)
    assert "ms (10 x fleet RTT baseline 0.05 ms, at least 1)" in passed.reason, passed.reason
    assert slow.status == "fail" and slow.figures["verdict"] == "slow", slow
    assert none == [None, None]
