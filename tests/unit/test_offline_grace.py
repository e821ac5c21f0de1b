"""The grace a node gets to come back before its ``offline`` is a death (issue #20, item 2), on a
fake clock: a Last Will waits ``last_will_s``, a clean stop ``clean_stop_s``; evidence of life
cancels; each node is due once; a second status does not extend the first deadline; 0 acts at once;
the config keys are validated with their path named."""

from __future__ import annotations

import pytest

from ftd.config import ConfigError, parse_config
from ftd.config.schema import OfflineGraceConfig
from ftd.coordinator.intake.offline_grace import LAST_WILL, STOPPED, OfflineGrace


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_each_way_of_leaving_gets_its_own_grace_and_is_due_once() -> None:
    clock = Clock()
    grace = OfflineGrace(OfflineGraceConfig(last_will_s=10, clean_stop_s=120), clock)
    assert grace.left("node-1", "offline").why == LAST_WILL
    assert grace.left("node-2", "stopped").why == STOPPED
    clock.now += 9.9
    assert grace.due() == []
    clock.now += 0.2
    assert [p.node for p in grace.due()] == ["node-1"]
    assert grace.due() == []  # once
    clock.now += 110
    assert [(p.node, p.grace_s) for p in grace.due()] == [("node-2", 120)]


def test_evidence_of_life_cancels_and_a_second_status_buys_no_time() -> None:
    clock = Clock()
    grace = OfflineGrace(OfflineGraceConfig(last_will_s=10, clean_stop_s=120), clock)
    first = grace.left("node-1", "stopped")
    clock.now += 100
    assert grace.left("node-1", "offline") == first  # the Last Will after a clean stop: same deadline
    cancelled = grace.alive("node-1")
    assert cancelled == first and grace.pending("node-1") is None
    clock.now += 1000
    assert grace.due() == [] and grace.alive("node-1") is None


def test_zero_acts_at_once() -> None:
    clock = Clock()
    grace = OfflineGrace(OfflineGraceConfig(last_will_s=0, clean_stop_s=0), clock)
    grace.left("node-1", "offline")
    assert [p.node for p in grace.due()] == ["node-1"]


def test_the_defaults_and_the_config_keys() -> None:
    cfg = parse_config("").coordinator.offline_grace
    assert (cfg.last_will_s, cfg.clean_stop_s) == (10.0, 120.0)
    cfg = parse_config("[coordinator.offline_grace]\nlast_will_s = 3\nclean_stop_s = 300\n").coordinator
    assert (cfg.offline_grace.last_will_s, cfg.offline_grace.clean_stop_s) == (3, 300)
    with pytest.raises(ConfigError, match=r"coordinator\.offline_grace\.last_will_s"):
        parse_config("[coordinator.offline_grace]\nlast_will_s = -1\n")
