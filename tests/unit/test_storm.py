"""Storm control: identical events collapse with an exact count; follow-on Xids are linked."""

from __future__ import annotations

from ftd.agent.storm import StormControl, identity
from ftd.events import Event, Kind, make_event


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def xid(code: int, pci: str = "0000:3b:00.0", pid: int = 1, node: str = "n1") -> Event:
    return make_event(
        node, Kind.XID, severity="error", source="kmsg", data={"code": code, "pci": pci, "pid": pid}
    )


def make(window: float = 10.0, follow: float = 30.0) -> tuple[StormControl, list[Event], Clock]:
    out: list[Event] = []
    clock = Clock()

    async def sink(event: Event) -> None:
        out.append(event)

    return StormControl(sink, window_s=window, follow_window_s=follow, clock=clock), out, clock


async def test_first_occurrence_is_published_at_once_and_repeats_fold_into_one_exact_summary() -> None:
    storm, out, clock = make()
    await storm.process(xid(45))
    assert len(out) == 1 and out[0].count == 1  # no waiting for the window
    for pid in range(2, 1001):  # the message (pid) differs, the identity (code + pci) does not
        await storm.process(xid(45, pid=pid))
    assert len(out) == 1
    await storm.tick()
    assert len(out) == 1  # window not over yet
    clock.now += 10.0
    await storm.tick()
    assert len(out) == 2
    summary = out[1]
    assert summary.count == 999 and summary.data["repeat_of"] == out[0].id
    assert summary.id != out[0].id
    assert sum(e.count for e in out) == 1000


async def test_ongoing_storm_yields_one_summary_per_window_and_counts_stay_exact() -> None:
    storm, out, clock = make(window=1.0)
    total = 0
    for _ in range(5):  # five windows of 100 events each
        for _ in range(100):
            await storm.process(xid(95))
            total += 1
        clock.now += 1.0
        await storm.tick()
    await storm.close()
    assert len(out) == 6  # the first + one summary per window
    assert sum(e.count for e in out) == total


async def test_quiet_window_retires_identity_so_the_next_one_is_immediate() -> None:
    storm, out, clock = make(window=1.0)
    await storm.process(xid(13))
    clock.now += 2.0
    await storm.tick()
    await storm.process(xid(13))
    assert [e.count for e in out] == [1, 1]


async def test_different_gpus_and_codes_are_different_events() -> None:
    storm, out, _ = make()
    await storm.process(xid(45, pci="0000:3b:00.0"))
    await storm.process(xid(45, pci="0000:86:00.0"))
    await storm.process(xid(13, pci="0000:3b:00.0"))
    assert len(out) == 3
    assert identity(out[0]) != identity(out[1]) != identity(out[2])


async def test_close_flushes_pending_repeats() -> None:
    storm, out, _ = make()
    for _ in range(7):
        await storm.process(xid(45))
    await storm.close()
    assert [e.count for e in out] == [1, 6]


async def test_follow_on_xid_is_linked_to_its_cause_on_the_same_gpu_only() -> None:
    storm, out, clock = make(follow=30.0)
    await storm.process(xid(149, pci="0000:3b:00.0"))
    await storm.process(xid(45, pci="0000:3b:00.0"))
    await storm.process(xid(45, pci="0000:86:00.0"))  # another GPU: not caused by it
    cause, follow, other = out
    assert "caused_by" not in cause.data
    assert follow.data["caused_by"] == cause.id and follow.data["caused_by_code"] == 149
    assert "caused_by" not in other.data
    await storm.process(xid(79, pci="0000:5e:00.0"))
    clock.now += 5
    await storm.process(xid(154, pci="0000:5e:00.0"))
    assert out[-1].data["caused_by"] == out[-2].id


async def test_follow_on_outside_the_window_is_not_linked_and_unrelated_codes_never() -> None:
    storm, out, clock = make(window=1.0, follow=5.0)
    await storm.process(xid(149))
    clock.now += 6
    await storm.process(xid(45))
    await storm.process(xid(13))  # 13 is not a follow-on of anything seen
    assert "caused_by" not in out[1].data
    assert "caused_by" not in out[2].data


async def test_window_zero_disables_collapsing() -> None:
    storm, out, _ = make(window=0.0)
    for _ in range(5):
        await storm.process(xid(45))
    assert [e.count for e in out] == [1] * 5
