"""Kill the broker, the coordinator or the agent mid-stream, on real processes: nothing is lost.

Each scenario is the one ``ftd bench chaos`` runs (:mod:`ftd.bench.chaos`: a private Mosquitto with
persistence and the default autosave, ``ftd coordinator`` and ``ftd agent`` as separate processes)
and the counts are exact: every line written to the kernel log is one event in the ledger, no more.
Before end-to-end receipts, ``broker_kill_backlog`` lost 300 of 320 events and
``broker_kill_before_session`` 300 of 300 (the agent deleted events on the broker's PUBACK).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ftd.bench.chaos import SCENARIOS, run_scenario
from tests.realparts import require_binary


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_kill_scenario_loses_nothing_and_repeats_nothing(name: str, tmp_path: Path) -> None:
    require_binary("mosquitto", package="mosquitto")
    result = run_scenario(name, tmp_path / name)
    assert result["notes"] == []
    assert result["sent"] > 0
    assert result["recorded"] == result["sent"], result
    assert result["lost"] == 0 and result["duplicated_actions"] == 0
