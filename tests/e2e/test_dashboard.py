"""The dashboard in a real headless Chromium: the page renders the cluster from the JSON API.

(At 10,000 nodes: tests/e2e/test_dashboard_scale.py.)

``--dump-dom`` after a virtual-time budget gives the DOM as the page's JavaScript left it, so the
assertions see what an operator sees (a node name, its drained state, an event, an action), not the
static HTML. A screenshot is kept under ``test-artifacts/`` for humans to look at.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from ftd.coordinator.daemon import Coordinator
from ftd.plugin.actions import ActionRecord, ActionRequest, ActionState
from tests.e2e.daemons import REPO
from tests.realparts import require_binary
from tests.unit.live_api import live_api

pytestmark = [pytest.mark.real]

ARTIFACTS = REPO / "test-artifacts"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,800",
    "--virtual-time-budget=5000",
]


def chromium(*args: str, timeout_s: float = 90) -> subprocess.CompletedProcess[str]:
    """Headless Chromium on the given arguments; ``timeout_s`` bounds the whole run (page load, the
    virtual-time budget, the dump)."""
    binary = require_binary("chromium", package="chromium")
    with tempfile.TemporaryDirectory(prefix="ftd-chromium-") as profile:
        return subprocess.run(
            [binary, *FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )


def test_dashboard_renders_nodes_events_and_actions() -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    screenshot = ARTIFACTS / "dashboard.png"
    screenshot.unlink(missing_ok=True)
    with live_api() as url:
        dom = chromium("--dump-dom", f"{url}/")
        assert dom.returncode == 0, dom.stderr[-2000:]
        html = dom.stdout
        shot = chromium(f"--screenshot={screenshot}", f"{url}/")
        assert shot.returncode == 0, shot.stderr[-2000:]

    (ARTIFACTS / "dashboard.html").write_text(html)
    assert "loading…" not in html  # every table was filled by the script
    problems = html[html.index('id="problems"') : html.index("</table>", html.index('id="problems"'))]
    assert '<td class="node">node-2</td>' in problems  # offline and drained by ftd: a problem
    assert "ftd: xid 79 gpu 0000:3b:00.0" in problems  # why it is drained
    assert "node-1" not in problems  # healthy: counted, not listed
    assert "2 nodes · 1 need a look · 1 healthy · 1 offline" in html
    assert "1 healthy nodes are counted here, not listed" in html
    assert "xid" in html and '">code 79</td>' in html  # the Xid event, its data readable (not JSON)
    assert "drain_node" in html and "succeeded" in html  # the action
    assert "bus connected" in html
    assert screenshot.exists() and screenshot.stat().st_size > 10_000
    assert Path(screenshot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


async def _restarting(coordinator: Coordinator) -> None:
    """A checkpoint_restart in flight whose stop and requeue are done: its next phase is ``restart``."""
    request = ActionRequest(
        kind="checkpoint_restart", target="42", reason="xid 79 on node-1", rule="xid_catalog"
    )
    detail = {"phases_done": ["stop", "requeue"], "ranks": [0], "saved": {"0": {}}}
    now = time.time()
    record = ActionRecord(
        id="cr-live", request=request, state=ActionState.RUNNING, detail=detail, created=now, updated=now
    )
    await coordinator.ledger.save_action(record)


def test_the_action_view_shows_the_phases_the_api_serves() -> None:
    """``#action=ID`` opens the action view; its phase comes from GET /v1/action-phases (the
    coordinator's executors), so the in-allocation ``restart`` phase is there: 3 of 4."""
    with live_api(seed=_restarting) as url:
        dom = chromium("--dump-dom", f"{url}/#action=cr-live")
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    view = html[html.index('id="action-facts"') : html.index("</dl>", html.index('id="action-facts"'))]
    assert "<dt>phase</dt><dd>running: restart (3 of 4)</dd>" in view


async def _pairs(coordinator: Coordinator) -> None:
    """Pair tests and pingmesh probes as the agents report them (issue #35): n1<->n2 fine, n3's
    probe to n2 slow (5 ms against the profile's 2 ms), n4's egress to n3 slow."""
    from ftd.events import Kind, Severity, make_event
    from ftd.fabric.pairs import PairResult

    results = [
        PairResult(a="n1", b="n2", a_to_b_gbps=24.0, b_to_a_gbps=23.0, rtt_ms=0.31, bytes_moved=1),
        PairResult(a="n3", b="n4", a_to_b_gbps=24.0, b_to_a_gbps=0.02, rtt_ms=0.45, bytes_moved=1),
        PairResult(a="n1", b="n3", a_to_b_gbps=22.0, b_to_a_gbps=22.5, rtt_ms=0.4, bytes_moved=1),
        PairResult(a="n3", b="n2", rtt_ms=5.0),  # a pingmesh probe: round trips only
    ]
    for result in results:
        coordinator.state.apply_event(
            make_event(
                result.a, Kind.PAIR_TEST, severity=Severity.INFO, source="pair_tests", data=result.as_dict()
            )
        )


def test_the_fabric_tab_draws_the_bandwidth_and_the_round_trip_matrices() -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    with live_api(seed=_pairs, hardware_profile="h200-sxm") as url:
        dom = chromium("--dump-dom", f"{url}/#fabric")
        assert dom.returncode == 0, dom.stderr[-2000:]
        shot = chromium(f"--screenshot={ARTIFACTS / 'fabric.png'}", f"{url}/#fabric")
        assert shot.returncode == 0, shot.stderr[-2000:]
    html = dom.stdout
    (ARTIFACTS / "fabric.html").write_text(html)
    rtt = html[html.index('id="pair-rtt"') : html.index("</table>", html.index('id="pair-rtt"'))]
    bandwidth = html[html.index('id="pairs"') : html.index("</table>", html.index('id="pairs"'))]
    assert (
        "from \\ to (Gbit/s)" in bandwidth and '<td class="pair-slow"' in bandwidth and "0.0200" in bandwidth
    )
    assert "from \\ to (ms)" in rtt
    assert '<td class="pair-slow" title="probe, ' in rtt and ">5.00</td>" in rtt, rtt  # n3 -> n2's probe
    assert '<td class="pair-pass" title="pair test, ' in rtt and ">0.310</td>" in rtt
    assert "RTT limit 2 ms (max_rtt_ms 2)" in html and "newest of a test or a probe" in html


async def _delayed(coordinator: Coordinator) -> None:
    """No hardware profile, so no max_rtt_ms: round trips judged against the fleet's RTT baseline
    (10 x the median, at least 1 ms). n4's egress queue full (as measured in namespaces: probes
    through it 10-80 ms, clean ones 0.04-0.22 ms): its probe to n2 and n1's pair test with it slow."""
    from ftd.events import Kind, Severity, make_event
    from ftd.fabric.pairs import PairResult

    results = [
        PairResult(a="n1", b="n2", rtt_ms=0.08),
        PairResult(a="n2", b="n3", rtt_ms=0.07),
        PairResult(a="n3", b="n1", rtt_ms=0.09),
        PairResult(a="n4", b="n2", rtt_ms=12.0),  # a probe through the full queue
        PairResult(a="n1", b="n4", a_to_b_gbps=20.0, b_to_a_gbps=19.0, rtt_ms=9.5, bytes_moved=1),
    ]
    for result in results:
        coordinator.state.apply_event(
            make_event(
                result.a, Kind.PAIR_TEST, severity=Severity.INFO, source="pair_tests", data=result.as_dict()
            )
        )


def test_the_fabric_tab_judges_round_trips_against_the_fleets_rtt_baseline_without_a_profile() -> None:
    with live_api(seed=_delayed) as url:
        dom = chromium("--dump-dom", f"{url}/#fabric")
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    rtt = html[html.index('id="pair-rtt"') : html.index("</table>", html.index('id="pair-rtt"'))]
    assert '<td class="pair-slow" title="probe, ' in rtt and ">12.0</td>" in rtt, rtt  # n4 -> n2's probe
    assert '<td class="pair-slow" title="pair test, ' in rtt and ">9.50</td>" in rtt, rtt  # n1 <-> n4
    assert '<td class="pair-pass" title="probe, ' in rtt and ">0.0800</td>" in rtt, rtt
    assert "not judged" not in rtt
    assert "RTT limit 1 ms (10 x fleet RTT baseline 0.09 ms, at least 1)" in html, html[-3000:]
