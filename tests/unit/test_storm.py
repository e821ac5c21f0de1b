"""Storm control: identical events collapse with an exact count; follow-on Xids are linked."""

from __future__ import annotations

from collections.abc import Callable

from ftd.agent.storm import Repeat, StormControl, StormState, Verdict, identity
from ftd.events import Event, Kind, Severity, make_event


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def xid(code: int, pci: str = "0000:3b:00.0", pid: int = 1, node: str = "n1") -> Event:
    return make_event(
        node, Kind.XID, severity="error", source="kmsg", data={"code": code, "pci": pci, "pid": pid}
    )


def fold(storm: StormControl, like: Event, event: Event) -> bool:
    """Offer ``event`` as a repeat of ``like`` without the event (the kmsg watcher's fast path)."""
    repeat = Repeat(identity(like), like.severity, lambda e: e)
    verdict = storm.offer(repeat, event)
    assert verdict is not Verdict.STAGED  # a repeat is counted or declined, never staged
    return verdict is Verdict.FOLDED


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


# --- repeats folded without an event (the kmsg fast path) ---------------------------------------


TICK_S = 0.25  # storm control's tick for a 1 s window


def feed_sequence(clock: Clock) -> list[tuple[float, Event]]:
    """A mixed run: two interleaved storms, a cause and its follow-on storm, quiet gaps, odd ones."""
    steps: list[tuple[float, Event]] = []
    n = 0

    def add(dt: float, code: int, pci: str, pid: int = 1) -> None:
        nonlocal n
        data = {"code": code, "pci": pci, "pid": pid, "line": n}
        event = make_event(
            "n1", Kind.XID, severity="error", source="kmsg", data=data, id=f"n1-kmsg-{n}-0", ts=1e9 + n
        )
        steps.append((dt, event))
        n += 1

    for i in range(60):  # two GPUs storming at once, and now and then a lone Xid on a third
        add(0.05, 95, "0000:3b:00.0", pid=i)
        add(0.0, 45, "0000:86:00.0")
        if i % 25 == 0:  # 1.25 s apart: each is a first occurrence (the window of 1 s retired it)
            add(0.0, 31, "0000:af:00.0")
    add(2.0, 43, "0000:ae:00.0")  # quiet: every storm window is flushed and retired
    add(1.0, 31, "0000:af:00.0")  # a lone Xid, then only distinct ones (nothing folds) ...
    for i in range(30):
        add(0.05, 43, f"0000:{i + 16:02x}:00.0")
    add(0.0, 31, "0000:af:00.0")  # ... and the lone one again, its window retired meanwhile
    add(3.0, 149, "0000:5e:00.0")  # a cause, then its follow-on storm
    for _ in range(40):
        add(0.1, 45, "0000:5e:00.0")
    add(5.0, 13, "0000:3b:00.0")  # after a quiet spell
    for _ in range(30):
        add(0.02, 13, "0000:3b:00.0")
    return steps


async def run_sequence(
    storm: StormControl, clock: Clock, steps: list[tuple[float, Event]], *, fast: bool
) -> None:
    ticked = clock.now
    for dt, event in steps:
        clock.now += dt
        if clock.now - ticked >= TICK_S:
            ticked = clock.now
            await storm.tick()
        if fast and fold(storm, event, event):
            continue
        await storm.process(event)
    await storm.close()


def comparable(event: Event) -> tuple[str, int, Severity, dict[str, object]]:
    return (event.id, event.count, event.severity, event.data)


async def test_a_repeat_without_its_event_counts_and_links_exactly_like_the_event() -> None:
    outputs = []
    for fast in (False, True):
        storm, out, clock = make(window=1.0, follow=30.0)
        steps = feed_sequence(clock)
        await run_sequence(storm, clock, steps, fast=fast)
        assert sum(e.count for e in out) == len(steps)
        outputs.append([comparable(e) for e in out])
    assert outputs[0] == outputs[1]
    follow_ons = [
        data for _, _, _, data in outputs[1] if data.get("code") == 45 and data["pci"] == "0000:5e:00.0"
    ]
    assert follow_ons and all(data["caused_by_code"] == 149 for data in follow_ons)  # summaries too


async def test_a_repeat_without_its_event_is_declined_without_an_open_window() -> None:
    storm, out, clock = make(window=1.0)
    event = xid(45)
    assert not fold(storm, event, event)  # never seen
    await storm.process(event)
    assert fold(storm, event, xid(45, pid=2))
    clock.now += 1.0
    assert not fold(storm, event, xid(45, pid=3))  # window over
    await storm.close()
    assert [e.count for e in out] == [1, 1] and out[1].data["pid"] == 2


async def test_a_follow_on_names_the_published_first_event_never_a_folded_repeat() -> None:
    storm, out, _ = make()
    await storm.process(xid(149))
    await storm.process(xid(149, pid=2))  # folded: its id is never published
    await storm.process(xid(45))
    assert out[-1].data["caused_by"] == out[0].id


# --- the checkpoint: written ahead of every publish, restored after a kill ----------------------


class Killed(Exception):
    """Stands for SIGKILL: raised at the chosen step, the instance is then abandoned."""


class Checkpoint:
    """Stands for the kmsg checkpoint: the reader's position, stored on "disk" with storm control's
    state whenever storm control saves it (each save is a kill point)."""

    def __init__(self, disk: dict[str, object], step: Callable[[], None]) -> None:
        self.disk = disk
        self.step = step
        self.position = int(disk.get("position", 0))  # type: ignore[call-overload]

    def saved(self) -> StormState | None:
        saved = self.disk.get("storm")
        return saved if isinstance(saved, StormState) else None

    def save(self, storm: StormState) -> None:
        self.step()
        self.disk.update(position=self.position, storm=storm)


class Node:
    """One agent life: storm control in front of a "spool" (what reached it survives a kill), with
    its checkpoint on "disk"."""

    def __init__(self, clock: Clock, disk: dict[str, object], spool: list[Event], kill_at: int) -> None:
        self.steps = 0
        self.kill_at = kill_at
        self.spool = spool
        self.checkpoint = Checkpoint(disk, self.step)
        self.storm = StormControl(
            self._spool, window_s=1.0, follow_window_s=30.0, clock=clock, checkpoint=self.checkpoint
        )

    def step(self) -> None:
        self.steps += 1
        if self.steps == self.kill_at:
            raise Killed

    async def _spool(self, event: Event) -> None:
        self.step()
        self.spool.append(event)


async def live(clock: Clock, steps: list[tuple[float, Event]], kill_at: int) -> tuple[list[Event], int]:
    """Run ``steps`` through storm control, killed at step ``kill_at`` (0: never) and restarted from
    its checkpoint until done; return the spool and the number of steps of the first life."""
    clock.now = 1000.0
    disk: dict[str, object] = {}
    spool: list[Event] = []
    life = first = Node(clock, disk, spool, kill_at)
    read = 0  # lines the kernel had written when the agent died: a restart reads them in one burst
    ticked = clock.now
    while True:
        try:
            for index in range(life.checkpoint.position, len(steps)):
                dt, event = steps[index]
                clock.now += dt if index >= read else 0.0
                read = max(read, index)
                if clock.now - ticked >= TICK_S:  # storm control's own task, between two lines
                    ticked = clock.now
                    await life.storm.tick()
                life.step()  # a kill between lines
                life.checkpoint.position = index + 1  # read before it goes in (as the watcher does)
                if not fold(life.storm, event, event):
                    await life.storm.process(event)
            await life.storm.close()
            return spool, first.steps
        except Killed:
            clock.now += 0.5  # the restart
            life = Node(clock, disk, spool, kill_at=0)  # from what is on "disk"


async def test_a_kill_at_any_step_loses_no_count_and_counts_none_twice() -> None:
    clock = Clock()
    steps = feed_sequence(clock)
    _, total = await live(clock, steps, kill_at=0)
    assert total > len(steps) + 20  # every line, checkpoint and publish is a kill point
    for kill_at in range(1, total + 1):
        spool, _ = await live(clock, steps, kill_at)
        seen: dict[str, int] = {}
        for event in spool:
            assert seen.setdefault(event.id, event.count) == event.count, f"{event.id} with two counts"
        assert sum(seen.values()) == len(steps), f"killed at step {kill_at}"
