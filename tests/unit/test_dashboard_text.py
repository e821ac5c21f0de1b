"""The dashboard's own words (issue #32), run in node over the page's script: an event's data read as
text, not JSON; when a problem began with its date; the jobs that train folded, every other job state
(one the page does not know included, such as a requeued job pending) listed as a problem."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from ftd.coordinator.api.dashboard import WEB_DIR
from tests.realparts import require_binary


def run(expression: str, *args: Any, before: str = "") -> Any:
    """``expression`` over app.js's exports (``app``) and ``args`` (``a``), in node, TZ=UTC; ``before``:
    statements run first (a browser global the function needs)."""
    node = require_binary("node", package="nodejs")
    script = (
        f"{before}const app = require(process.argv[1]); const a = JSON.parse(process.argv[2]);"
        f"console.log(JSON.stringify({expression}));"
    )
    out = subprocess.run(
        [node, "-e", script, str(WEB_DIR / "app.js"), json.dumps(list(args))],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
        env={"TZ": "UTC", "PATH": "/usr/bin:/bin"},
    )
    return json.loads(out.stdout)


def test_event_data_reads_as_text() -> None:
    data = {"code": 79, "pci": "0000:3b:00.0", "message": "", "gpus": [0, 1], "extra": {"a": 1}, "x": None}
    assert run("app.eventText(a[0])", data) == "code 79 · pci 0000:3b:00.0 · gpus 0, 1 · extra a=1"
    assert run("app.eventText(a[0], 10)", {"message": "x" * 50}) == "message x…"
    assert run("app.eventText(a[0])", None) == ""


def test_since_has_its_date_and_age() -> None:
    began = 1_796_400_000.0  # 2026-12-04 16:00:00 UTC
    assert (
        run("app.dateTime(a[0], a[1])", began, began + 3 * 3600 + 300)
        == "2026-12-04 16:00:00 (3 h 5 min ago)"
    )
    assert run("app.dateTime(a[0], a[1])", began, began + 2 * 86400) == "2026-12-04 16:00:00 (2 d 0 h ago)"
    assert run("app.dateTime(a[0], a[1])", None, began) == ""


def test_training_jobs_fold_and_every_other_state_is_a_problem() -> None:
    jobs = [{"id": str(i), "state": "training"} for i in range(300)]
    jobs += [{"id": "a", "state": "pending_requeue"}, {"id": "b", "state": "pending after requeue"}]
    jobs += [{"id": "c", "state": "saving"}, {"id": "d", "state": "allocated"}]
    folded = run("app.foldJobs(a[0])", jobs)
    assert folded["training"] == 300
    assert [j["id"] for j in folded["problems"]] == ["a", "b", "c", "d"]


def test_an_approval_records_the_name_asked_once_per_tab() -> None:
    """The API token names nobody: the page asks a name, keeps it for the tab, sends NAME@dashboard
    (what the API's ``by`` accepts: letters, digits, ._-@, at most 64)."""
    browser = (
        "const store = {}; let asked = 0;"
        "globalThis.sessionStorage = {getItem: (k) => store[k] || null,"
        " setItem: (k, v) => { store[k] = v; }};"
        "globalThis.window = {prompt: () => { asked += 1; return a0; }};"
    )
    twice = "[app.approver(), app.approver(), asked]"
    typed = "' Alice Smith <alice@example.org>'"
    assert run(twice, before=f"const a0 = {typed};" + browser) == [
        "AliceSmithaliceexample.org@dashboard"
    ] * 2 + [1]
    assert run(twice, before="const a0 = null;" + browser) == ["", "", 2]  # cancelled: nothing sent
    long = run("app.approver()", before=f"const a0 = {'x' * 200!r};" + browser)
    assert long == "x" * 50 + "@dashboard"


def test_the_pair_matrix_puts_the_slow_nodes_first_and_says_what_each_cell_is() -> None:
    cell = {"rtt_ms": 0.1, "age_s": 1.0, "error": "", "reasons": ["ok"]}
    matrix = {
        "nodes": ["a", "b", "c", "d"],
        "cells": [
            {**cell, "from": "a", "to": "b", "gbps": 9.87, "status": "pass"},
            {**cell, "from": "b", "to": "a", "gbps": 9.5, "status": "pass"},
            {**cell, "from": "d", "to": "c", "gbps": 0.0191, "status": "slow", "reasons": ["d -> c: slow"]},
            {**cell, "from": "c", "to": "d", "gbps": None, "status": "failed", "error": "timed out"},
        ],
    }
    grid = run("app.pairGrid(a[0], 3)", matrix)
    assert grid["nodes"] == ["c", "d", "a"] and grid["hidden"] == 1
    rows = {row[0]: row[1:] for row in grid["rows"]}
    assert rows["d"][0] == {"text": "0.0191", "status": "slow", "title": "d -> c: slow"}
    assert rows["c"][1]["text"] == "failed" and rows["c"][0]["text"] == ""
    assert rows["a"][0] == {"text": "·", "status": "none", "title": "not tested"}


def test_the_round_trip_matrix_judges_tests_against_the_served_limit_and_says_where_it_comes_from() -> None:
    """No profile (no max_rtt_ms): the API's rtt_limit_ms (10 x the fleet's RTT baseline, at least
    1 ms) judges a pair test's round trip; a probe keeps its own verdict; no limit: not judged."""
    cell = {"gbps": 9.0, "age_s": 2.0, "error": "", "reasons": [], "status": "pass"}
    matrix = {
        "nodes": ["a", "b", "c"],
        "max_rtt_ms": None,
        "rtt_limit_ms": 1.0,
        "rtt_limit": "10 x fleet RTT baseline 0.08 ms, at least 1",
        "cells": [
            {**cell, "from": "a", "to": "b", "rtt_ms": 0.09},
            {**cell, "from": "c", "to": "a", "rtt_ms": 9.5},
        ],
        "probes": [{"from": "b", "to": "c", "rtt_ms": 12.0, "age_s": 1.0, "status": "slow"}],
    }
    grid = run("app.rttGrid(a[0])", matrix)
    assert grid["nodes"] == ["a", "b", "c"] and grid["hidden"] == 0  # each is in a slow round trip
    rows = {row[0]: dict(zip(grid["nodes"], row[1:], strict=True)) for row in grid["rows"]}
    assert rows["c"]["a"]["status"] == "slow" and rows["c"]["a"]["text"] == "9.50"
    assert rows["a"]["b"]["status"] == "pass" and rows["b"]["c"]["status"] == "slow"
    assert rows["b"]["c"]["title"].startswith("probe, ")
    assert (
        run("app.rttLimitText(a[0])", matrix)
        == "RTT limit 1 ms (10 x fleet RTT baseline 0.08 ms, at least 1)"
    )
    unjudged = {**matrix, "rtt_limit_ms": None, "rtt_limit": ""}
    grid = run("app.rttGrid(a[0])", unjudged)
    rows = {row[0]: dict(zip(grid["nodes"], row[1:], strict=True)) for row in grid["rows"]}
    assert rows["c"]["a"]["status"] == "pass" and "not judged" in rows["c"]["a"]["title"]
    assert "round trips not judged" in run("app.rttLimitText(a[0])", unjudged)
    assert run("app.rttLimitText(a[0])", {**unjudged, "max_rtt_ms": 2}) == "RTT limit 2 ms (max_rtt_ms)"
