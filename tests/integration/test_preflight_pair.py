"""A pair test in preflight (issue #35): ``ftd preflight --pair-peer`` against a real pair-test server
process, and the agent's preflight with and without the peer a directive names."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ftd.bench.slurm_cluster import free_port

MB = 1 << 20


def _config(tmp: Path, key: Path, hardware: str = "") -> Path:
    path = tmp / "agent.toml"
    path.write_text(
        f"""{hardware}
[agent]
node = "n1"
state_dir = "{tmp / "state"}"

[agent.nvml]
enabled = false

[agent.preflight]
allow_unchecked = true

[agent.pair_tests]
key_file = "{key}"
max_bytes = {2 * MB}
timeout_s = 5.0
allreduce_bytes = 0
"""
    )
    return path


@pytest.fixture
def key(tmp_path: Path) -> Path:
    path = tmp_path / "pair.key"
    path.write_text("preflight-pair-key\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def peer(key: Path) -> Iterator[int]:
    """A known-good idle agent's pair-test server: a real process on 127.0.0.1."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ftd.agent.pair_tests", "serve", "--node", "n2", "--key-file", str(key),
         "--host", "127.0.0.1"],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    yield int(json.loads(proc.stdout.readline())["port"])
    proc.terminate()
    proc.wait(30)


def _preflight(config: Path, *args: str) -> tuple[int, dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, "-m", "ftd.cli", "preflight", "--config", str(config), "--json", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = out.stdout.strip().splitlines()
    return out.returncode, json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {
        "out": out.stdout
    }


def test_preflight_runs_the_pair_test_it_is_given_and_fails_when_it_does_not_complete(
    tmp_path: Path, key: Path, peer: int
) -> None:
    config = _config(tmp_path, key)
    code, report = _preflight(config, "--pair-peer", f"n2=127.0.0.1:{peer}")
    checks = {c["name"]: c for c in report["checks"]}
    # measured, but with no hardware profile here and no fleet baseline it is not judged: said, not passed
    assert code == 0 and checks["pair_test"]["status"] == "skip", report
    assert "nothing to judge against" in checks["pair_test"]["reason"]
    dead = free_port()
    code, report = _preflight(config, "--pair-peer", f"n2=127.0.0.1:{dead}")
    checks = {c["name"]: c for c in report["checks"]}
    assert code == 1 and checks["pair_test"]["status"] == "fail", report
    assert "test did not complete" in checks["pair_test"]["reason"] and report["reason"].startswith(
        "pair_test:"
    )
    code, report = _preflight(config, "--pair-peer", "n2-no-address")
    assert code == 2 and "expected NODE=HOST:PORT" in report["out"]
    # with a hardware profile (an operator's, for loopback) the same test is judged, and passes
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(
        '[profiles.loop]\ngpu_names = ["none"]\n[pair.loop]\nexpected_gbps = 0.1\nmax_rtt_ms = 500.0\n'
    )
    judged = _config(tmp_path, key, f'[hardware]\nprofile = "loop"\ncatalog = "{catalog}"\n')
    code, report = _preflight(judged, "--pair-peer", f"n2=127.0.0.1:{peer}")
    checks = {c["name"]: c for c in report["checks"]}
    assert code == 0 and checks["pair_test"]["status"] == "pass", report
    assert "0.8 x spec 0.1 Gbit/s" in checks["pair_test"]["reason"]


def test_the_agents_preflight_tests_the_peer_a_directive_names_and_skips_without_one(
    tmp_path: Path, key: Path, peer: int
) -> None:
    from ftd.agent.hooks import NodeHooks
    from ftd.agent.pair_tests.service import PairTestService, training
    from ftd.config import load_config

    cfg = load_config(_config(tmp_path, key)).agent
    hooks = NodeHooks.__new__(NodeHooks)  # only what preflight_now reads
    hooks.cfg = cfg
    hooks._nvml_backend = None
    hooks.pair_tests = PairTestService(cfg.pair_tests, "n1", busy=training(dict, dict))

    class NoConditions:
        def clear_all(self, **_: Any) -> None:
            return None

    hooks._conditions = NoConditions()  # type: ignore[assignment]
    named = {"pair_peer": {"node": "n2", "host": "127.0.0.1", "port": peer}}
    with_peer = asyncio.run(hooks.preflight_now(named))
    without = asyncio.run(hooks.preflight_now({}))
    tested = {c["name"]: c for c in with_peer["checks"]}["pair_test"]
    assert tested["status"] == "skip" and "nothing to judge against" in tested["reason"], tested  # measured
    dead = {"pair_peer": {"node": "n2", "host": "127.0.0.1", "port": free_port()}}
    failed = asyncio.run(hooks.preflight_now(dead))
    assert failed["ok"] is False and failed["reason"].startswith("pair_test: test did not complete"), failed
    skipped = {c["name"]: c for c in without["checks"]}["pair_test"]
    assert skipped == {"name": "pair_test", "status": "skip", "reason": "no peer named to test against"}
