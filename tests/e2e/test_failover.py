"""Two coordinator processes on a real PostgreSQL and Mosquitto: the leader SIGKILLed mid
checkpoint_restart, then the next leader SIGSTOPped past its lease and woken (``ftd bench failover``
at a smaller size). Counts, not times: nothing lost, nothing done twice or left undone, nothing done
by the fenced leader; each failure handed the lease to the other replica."""

from __future__ import annotations

import pytest

from ftd.bench.failover import bench_failover
from tests.realparts import require_binary, require_postgres

pytestmark = pytest.mark.timeout(300)


def test_failover_kill_and_freeze_lose_nothing_and_do_nothing_twice() -> None:
    require_binary("mosquitto", package="mosquitto")
    require_postgres()
    result = bench_failover(jobs=4, gap_s=0.3, stream_hz=20.0, fence_watch_s=2.0)
    assert result["lost_events"] == 0
    assert result["actions_done_twice"] == 0
    assert result["actions_missing"] == 0
    assert result["unfinished_actions"] == 0
    assert result["fenced_side_effects"] == 0
    assert [t["how"] for t in result["takeovers"]] == ["SIGKILL", "SIGSTOP"]
    assert [t["new_leader"] for t in result["takeovers"]] == ["coord-b", "coord-a"]
    assert result["events_sent"] > 4
