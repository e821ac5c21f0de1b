"""``ftd bench scale`` run tiny (200 sessions, 50 Last Wills) on a real Mosquitto: exact counts.

The full run (10,000 sessions, 1,000 wills) is a benchmark, run by hand (docs/architecture.md §10);
this proves the harness and the coordinator's accounting: every session held and tracked, every
Last Will recorded and decided, each job with a node in the dark rack restarted once, none other.
No timing is asserted.
"""

from __future__ import annotations

import pytest

from ftd.bench.scale import bench_scale
from tests.realparts import require_binary


@pytest.mark.real
def test_bench_scale_small_counts_exact() -> None:
    require_binary("mosquitto", package="mosquitto")
    result = bench_scale(nodes=200, wills=50, samples=20)
    assert result["connections_held"] == 200 and result["connect_failures"] == 0
    assert result["coordinator_tracked_online"] == 200
    assert result["xid_sent"] == 20 and result["xid_decided"] == 20
    assert result["storm_all_decided"] is True
    assert (result["wills_decided"], result["wills_recorded"], result["wills_lost"]) == (50, 50, 0)
    assert result["online_after_storm"] == 150
    # the storm's figures are the rack's nodes: no other node went offline, none was counted
    assert (result["offline_outside_rack_decided"], result["offline_outside_rack_recorded"]) == (0, 0)
    assert result["jobs_in_rack"] == 5
    assert result["restarts_per_job_in_rack"] == [(1, 5)]  # five jobs, one restart each
    assert result["jobs_in_rack_restarted_once"] == 5
    assert result["restarts_outside_rack"] == 0
    assert result["drains"] == 0
    assert result["bad_messages"] == 0 and result["placement_violations"] == 0
