"""``ftd sim goodput``: the --json shape, the PNG, the last-run state file, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ftd.cli import main
from ftd.sim.goodput.model import CAUSES, POLICIES

SHORT = ["sim", "goodput", "--days", "3", "--seeds", "2", "--sweep-seeds", "1", "--no-entry-points"]


def test_json_has_every_figure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "last.json"
    assert main([*SHORT, "--scenario", "fast", "--json", "--state", str(state)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["scenario"] == "fast"
    assert report["params"]["checkpoint_interval_s"] == 75.0
    assert report["params"]["days"] == 3.0
    assert report["seeds"] == [1, 2]
    assert set(report["policies"]) == set(POLICIES)
    for policy in report["policies"].values():
        assert 0.0 <= policy["ettr"] <= 1.0
        assert len(policy["ettr_by_seed"]) == 2
        assert policy["ettr"] == pytest.approx(sum(policy["ettr_by_seed"]) / 2)
        assert set(policy["lost_gpu_hours"]) == set(CAUSES)
        for key in ("interruptions", "nodes_drained", "mttr_s", "lost_fraction_by_category"):
            assert key in policy
        lost = sum(policy["lost_fraction"].values())
        assert policy["ettr"] + lost == pytest.approx(1.0)
    assert report["policies"]["no_ftd"]["engine_verdicts"] == []
    assert report["policies"]["ftd"]["engine_verdicts"]
    intervals = [p["checkpoint_interval_s"] for p in report["sweep"]]
    assert intervals == sorted(intervals) and len(intervals) >= 6
    assert min(intervals) < report["young_daly_s"] < max(intervals)
    assert json.loads(state.read_text()) == report  # the dashboard's copy of the last run


def test_plot_is_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "goodput.png"
    assert main([*SHORT, "--plot", str(png), "--state", str(tmp_path / "s.json")]) == 0
    out = capsys.readouterr().out
    assert "ETTR" in out and "Young/Daly" in out and f"plot: {png}" in out
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000


def test_text_explains_the_loss(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SHORT, "--no-sweep", "--trace", "opt175b", "--state", str(tmp_path / "s.json")]) == 0
    out = capsys.readouterr().out
    assert "OPT-175B" in out
    assert "no_ftd:" in out and "ftd:" in out and "by fault category" in out
    assert "ETTR by checkpoint interval" not in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--trace", "/nonexistent/mix.toml"], "/nonexistent/mix.toml"),
        (["--scenario", "nope"], "no scenario 'nope'"),
        (["--same-node-p", "2"], "--same-node-p must be within [0, 1]"),
        (["--checkpoint-interval-s", "0"], "--checkpoint-interval-s must be > 0"),
        (["--config", "/nonexistent/ftd.toml"], "/nonexistent/ftd.toml"),
    ],
)
def test_bad_input_is_a_clear_error(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*SHORT, *args, "--state", str(tmp_path / "s.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ftd sim goodput: ") and message in err
    assert not (tmp_path / "s.json").exists()


def test_a_recording_is_the_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ftd.events import encode, make_event

    t0 = 1_750_000_000.0
    events = [
        make_event("gpu-a", "thermal", severity="warning", ts=t0 + 3600, data={"gpu": 1}),
        make_event("gpu-a", "gpu_fallen_off_bus", severity="critical", ts=t0 + 3660),
        make_event("gpu-b", "rank_heartbeat_lost", severity="error", ts=t0 + 7200, data={"rank": 3}),
        make_event("gpu-c", "thermal", severity="warning", ts=t0 + 9000),  # a warning only: no fault
        make_event("gpu-a", "xid", severity="error", ts=t0 + 2 * 86400, data={"code": 13}),
    ]
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(encode(e) + b"\n" for e in events) + b"not json\n")
    args = [*SHORT[:2], "--events", str(path), "--json", "--no-sweep", "--no-entry-points"]
    assert main([*args, "--state", str(tmp_path / "s.json")]) == 0
    report = json.loads(capsys.readouterr().out)
    counts = {"events": 5, "bad_lines": 1, "incidents": 4, "faults": 3}
    assert report["recording"] == {"path": str(path), **counts}
    assert report["params"]["days"] == pytest.approx(2.0)  # first to last event, plus an hour
    assert report["faults_per_run"] == 3
    ftd, no_ftd = report["policies"]["ftd"], report["policies"]["no_ftd"]
    assert no_ftd["proactive_moves"] == 0
    # gpu-a's fall off the bus, and gpu-b drained as the suspect its hang's (simulated) verdict names
    assert {"kind": "drain_node", "verdict": "allowed", "count": 2} in ftd["engine_verdicts"]
    assert {"kind": "diagnose_hang", "verdict": "allowed", "count": 1} in ftd["engine_verdicts"]
    assert ftd["ettr"] > no_ftd["ettr"]


def test_an_empty_recording_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"\n")
    assert main([*SHORT, "--events", str(path), "--state", str(tmp_path / "s.json")]) == 2
    assert "no events" in capsys.readouterr().err


def test_bench_sim_reports_both_policies(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "sim", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert result["gpus"] == 16384 and result["days"] == 54.0 and result["faults"] > 300
    assert result["no_ftd_s_per_run"] > 0 and result["ftd_s_per_run"] > 0  # measured, not judged
    assert result["no_ftd_ettr"] < result["ftd_ettr"]
    assert result["engine_actions"] > result["faults"]
