"""Slow ranks at the coordinator (issue #33): job presence with step timing -> ``rank_slow`` events
(:mod:`ftd.coordinator.intake.slow_ranks`) -> the ``straggler`` rule's cost model.

The ranks' counters are what a synchronous job's clients would send (``tests.unit.test_slow_steps``'s
simulator): every step as long as the slowest rank's compute, each rank's compute its own. The GPU
clocks a finding quotes come from what the NVML watcher sends, run on its fake.
"""

from __future__ import annotations

import msgspec
import pytest

from ftd.agent.watchers.nvml.fake import FakeNvml
from ftd.agent.watchers.nvml.watcher import NvmlWatcher
from ftd.config import NvmlConfig, SlowRanksConfig
from ftd.coordinator.intake.slow_ranks import SlowRanks
from ftd.coordinator.model.state import ClusterState
from ftd.events import Event, JobPresence, Kind, RankInfo, StepTiming
from ftd.rules import straggler
from ftd.testing import evaluate_rule, make_event
from tests.unit.test_slow_steps import _Sim


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _feed(
    sim: _Sim,
    slow: SlowRanks,
    clock: _Clock,
    seconds: int,
    *,
    job: str = "j1",
    node_of=lambda r: f"n{r + 1}",
    local_rank=lambda r: 0,
) -> list[Event]:
    events: list[Event] = []
    for _ in range(seconds):
        sim.second()
        clock.t += 1
        by_node: dict[str, list[RankInfo]] = {}
        for rank in sim.totals:
            by_node.setdefault(node_of(rank), []).extend(
                msgspec.structs.replace(info, local_rank=local_rank(rank)) for info in sim.view(rank)
            )
        for node, ranks in sorted(by_node.items()):
            events += slow.observe(node, job, JobPresence(job=job, node=node, ranks=ranks))
    return events


def _kinds(requests: list) -> list[tuple[str, str]]:
    return [(str(r.kind), r.target) for r in requests]


@pytest.mark.parametrize("seed", range(3))
def test_one_slow_rank_is_one_event_naming_its_node_and_the_rule_swaps_it(seed: int) -> None:
    clock = _Clock()
    slow = SlowRanks(SlowRanksConfig(), clock=clock)
    sim = _Sim(seed, {0: 0.1, 1: 0.1, 2: 0.1})
    assert _feed(sim, slow, clock, 60) == []
    sim.compute[2] = 0.2
    events = _feed(sim, slow, clock, 60)
    assert len(events) == 1, [e.data for e in events]  # one per episode
    [event] = events
    assert (event.kind, event.node, event.source) == (Kind.RANK_SLOW, "n3", "coordinator")
    data = event.data
    assert data["scope"] == "node" and data["ranks"] == [2] and data["measured"] is True
    assert 1.5 < data["slowdown"] < 2.6 and data["gpus"] == 3 and data["repeats"] == 1
    assert data["expected_loss_s"] == pytest.approx((1 - 1 / data["slowdown"]) * 3600, abs=1)
    assert data["swap_cost_s"] == 10.0
    requests = evaluate_rule(straggler, event)
    assert _kinds(requests) == [("notify", "n3"), ("checkpoint_restart", "j1")]
    assert requests[1].params["exclude"] == ["n3"]


def test_a_loss_below_the_swap_cost_only_notifies_and_repeats_drain() -> None:
    clock = _Clock()
    cfg = SlowRanksConfig(remaining_s=5.0, exclude_after=2)  # 5 s left: never worth a swap
    slow = SlowRanks(cfg, clock=clock)
    sim = _Sim(7, {0: 0.1, 1: 0.1, 2: 0.1})
    _feed(sim, slow, clock, 60)
    found = []
    for _ in range(2):  # two episodes of node n2
        sim.compute[1] = 0.2
        found += _feed(sim, slow, clock, 40)
        sim.compute[1] = 0.1
        assert _feed(sim, slow, clock, 60) == []  # back to normal: the episode ends, nothing new
    assert [(e.node, e.data["repeats"]) for e in found] == [("n2", 1), ("n2", 2)]
    assert _kinds(evaluate_rule(straggler, found[0])) == [("notify", "n2")]
    assert _kinds(evaluate_rule(straggler, found[1])) == [("notify", "n2"), ("drain_node", "n2")]


def test_every_rank_slowed_together_is_the_job_and_never_excludes_a_node() -> None:
    clock = _Clock()
    slow = SlowRanks(SlowRanksConfig(exclude_after=1), clock=clock)
    sim = _Sim(3, {0: 0.1, 1: 0.1, 2: 0.1})
    _feed(sim, slow, clock, 60)
    sim.compute = {r: 0.2 for r in sim.compute}
    events = _feed(sim, slow, clock, 60)
    assert [(e.data["scope"], e.data.get("not_node")) for e in events] == [("job", True)]
    assert "repeats" not in events[0].data
    assert _kinds(evaluate_rule(straggler, events[0])) == [("notify", events[0].node)]


def test_a_throttled_gpu_is_named_and_one_rank_of_a_node_is_its_gpu() -> None:
    clock = _Clock()
    state = ClusterState()
    hot = {"active": True, "throttle_reasons": ["hw_thermal_slowdown"]}
    for index, data in ((0, hot), (1, hot), (1, {"active": False, "throttle_reasons": []})):
        state.apply_event(make_event("n2", Kind.THERMAL, data={"index": index, **data}, ts=clock.t))
    state.apply_event(make_event("n1", Kind.THERMAL, data={"index": 0, **hot}, ts=clock.t - 3600))  # stale
    slow = SlowRanks(SlowRanksConfig(), node_events=state.node_events, clock=clock)
    sim = _Sim(5, {0: 0.1, 1: 0.1, 2: 0.1, 3: 0.1})
    node_of = {0: "n1", 1: "n1", 2: "n2", 3: "n2"}
    local_rank = {0: 0, 1: 1, 2: 0, 3: 1}
    _feed(sim, slow, clock, 60, node_of=node_of.__getitem__, local_rank=local_rank.__getitem__)
    sim.compute[3] = 0.2  # node n2's local rank 1: its GPU 1 stopped throttling, GPU 0 still does
    [event] = _feed(sim, slow, clock, 60, node_of=node_of.__getitem__, local_rank=local_rank.__getitem__)
    assert (event.node, event.data["scope"], event.data["ranks"]) == ("n2", "gpu", [3])
    assert event.data["local_ranks"] == [1]
    assert event.data["throttled_gpus"] == [{"gpu": 0, "reasons": ["hw_thermal_slowdown"]}]  # not its own
    sim.compute[3] = 0.1
    assert _feed(sim, slow, clock, 60, node_of=node_of.__getitem__, local_rank=local_rank.__getitem__) == []
    sim.compute[0] = 0.2  # node n1's rank 0: its GPU's throttling is an hour old
    events = _feed(sim, slow, clock, 60, node_of=node_of.__getitem__, local_rank=local_rank.__getitem__)
    assert [(e.node, e.data["ranks"], "throttled_gpus" in e.data) for e in events] == [("n1", [0], False)]


def test_memory_is_bounded_and_a_job_that_left_is_forgotten() -> None:
    clock = _Clock()
    slow = SlowRanks(SlowRanksConfig(max_jobs=2), clock=clock)
    timing = StepTiming(steps=1, step_s=0.1, compute_s=0.05)
    for job in ("a", "b", "c"):
        slow.observe("n1", job, JobPresence(job=job, node="n1", ranks=[RankInfo(rank=0, timing=timing)]))
    assert list(slow.jobs) == ["b", "c"]
    slow.observe("n1", "c", None)
    assert list(slow.jobs) == ["b"]
    # an older client (no timing) costs nothing
    slow.observe("n1", "d", JobPresence(job="d", node="n1", ranks=[RankInfo(rank=0)]))
    assert "d" not in slow.jobs
    off = SlowRanks(SlowRanksConfig(enabled=False), clock=clock)
    assert (
        off.observe("n1", "a", JobPresence(job="a", node="n1", ranks=[RankInfo(rank=0, timing=timing)])) == []
    )
    assert not off.jobs


def test_hostile_figures_in_a_rank_slow_event_only_notify() -> None:
    for data in (
        {},
        {"job": 5, "expected_loss_s": "lots"},
        {"job": "j1", "expected_loss_s": True, "swap_cost_s": 1, "repeats": "9"},
    ):
        requests = evaluate_rule(straggler, make_event("n1", Kind.RANK_SLOW, data=data))
        assert _kinds(requests) == [("notify", "n1")], data


def test_the_schedulers_time_left_weighs_the_swap_and_says_where_it_came_from() -> None:
    """A job 8 s from its time limit is not worth a swap, whatever remaining_s assumes; a job the
    scheduler said nothing about falls back to remaining_s, and the event says which it used."""
    left: dict[str, float | None] = {"j1": 8.0, "j2": None}
    for job, expect_swap, source in (("j1", False, "scheduler"), ("j2", True, "config")):
        clock = _Clock()
        slow = SlowRanks(SlowRanksConfig(), clock=clock, remaining_for=left.get)
        sim = _Sim(5, {0: 0.1, 1: 0.1, 2: 0.1})
        _feed(sim, slow, clock, 60, job=job)
        sim.compute[2] = 0.2
        [event] = _feed(sim, slow, clock, 60, job=job)
        assert event.data["remaining_from"] == source
        assert event.data["remaining_s"] == (8.0 if source == "scheduler" else 3600.0)
        kinds = [k for k, _ in _kinds(evaluate_rule(straggler, event))]
        assert ("checkpoint_restart" in kinds) is expect_swap, (job, kinds)


async def _watcher_events(node: str, sm_clocks: tuple[int, int] | None, throttle: int = 0) -> list[Event]:
    """What the NVML watcher (on the fake) sends about a one-GPU node in its first poll."""
    fake = FakeNvml(1)
    fake.init()
    fake.gpu(0).sm_clocks = sm_clocks
    fake.gpu(0).throttle = throttle
    sent: list[Event] = []

    async def emit(event: Event) -> None:
        sent.append(event)

    watcher = NvmlWatcher(NvmlConfig(interval_s=0.05), node, emit, backend=fake, clock=lambda: 0.0)
    watcher.available = True
    await watcher.poll_once()
    return sent


async def test_a_slow_rank_says_its_gpus_sm_clock_against_the_others() -> None:
    clock = _Clock()
    state = ClusterState()
    sent = await _watcher_events("n3", (990, 1980), throttle=0x40)  # throttled, then its clock
    sent += await _watcher_events("n1", (1980, 1980))
    sent += await _watcher_events("n2", None)  # a GPU that does not report clocks: not known
    assert [(e.node, e.data.get("signal")) for e in sent if e.kind is Kind.THERMAL] == [
        ("n3", None),
        ("n3", "sm_clocks"),
        ("n1", "sm_clocks"),
    ]
    read_at = clock.t - 5
    for event in sent:
        state.apply_event(msgspec.structs.replace(event, ts=read_at))
    slow = SlowRanks(SlowRanksConfig(), node_events=state.node_events, clock=clock)
    sim = _Sim(11, {0: 0.1, 1: 0.1, 2: 0.1})
    assert _feed(sim, slow, clock, 60) == []
    sim.compute[2] = 0.2
    [event] = _feed(sim, slow, clock, 60)
    assert event.node == "n3"
    clocks = event.data["gpu_clocks"]
    assert set(clocks) == {"n1", "n3"}  # n2's GPU said nothing: left out, never a guess
    assert {k: v for k, v in clocks["n3"]["0"].items() if k != "age_s"} == {"sm_mhz": 990, "max_mhz": 1980}
    assert {k: v for k, v in clocks["n1"]["0"].items() if k != "age_s"} == {"sm_mhz": 1980, "max_mhz": 1980}
    assert clocks["n3"]["0"]["age_s"] == pytest.approx(event.ts - read_at)
    # the clock reading after the throttle event does not hide the throttle
    assert event.data["throttled_gpus"][0]["reasons"] == ["hw_thermal_slowdown"]


def test_stale_or_malformed_clock_readings_are_unknown() -> None:
    clock = _Clock()
    state = ClusterState()
    reading = {"signal": "sm_clocks", "index": 0, "sm_mhz": 990, "max_mhz": 1980}
    state.apply_event(make_event("n3", Kind.THERMAL, data=reading, ts=clock.t - 3600))  # an hour old
    bad = {**reading, "sm_mhz": "fast"}
    state.apply_event(make_event("n1", Kind.THERMAL, data=bad, ts=clock.t))
    slow = SlowRanks(SlowRanksConfig(), node_events=state.node_events, clock=clock)
    sim = _Sim(12, {0: 0.1, 1: 0.1, 2: 0.1})
    _feed(sim, slow, clock, 60)
    sim.compute[2] = 0.2
    [event] = _feed(sim, slow, clock, 60)
    assert event.node == "n3" and "gpu_clocks" not in event.data
