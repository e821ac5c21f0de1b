"""RetainedFirst: retained messages go through, the rest waits for this run's marker (or a timeout),
then goes in its order; every marker is acknowledged. The real-broker reproduction is
``tests/contract/test_coordinator_restart_order.py``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import structlog.testing

from ftd.bus import topics
from ftd.bus.base import Message
from ftd.coordinator.retained_first import RetainedFirst


class Feed:
    """An async message source the test fills while the reader waits."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Message] = asyncio.Queue()

    async def messages(self) -> AsyncIterator[Message]:
        while True:
            yield await self.queue.get()

    def put(self, *messages: Message) -> None:
        for message in messages:
            self.queue.put_nowait(message)


def event(n: int) -> Message:
    return Message(topics.node_event("node-1", "xid"), f"event {n}".encode())


def presence(job: str) -> Message:
    return Message(topics.node_job("node-1", job), job.encode(), retain=True)


async def test_queued_events_wait_for_the_marker_and_keep_their_order() -> None:
    order = RetainedFirst(timeout_s=5.0)
    feed = Feed()
    taken: list[Message] = []
    acked: list[Message] = []

    async def take(message: Message) -> None:
        taken.append(message)

    stale = Message(topics.COORDINATOR_SYNC, b"an earlier run's token")
    # What a broker sends a restarting coordinator: the queued events (and an earlier run's marker
    # left in the session) first, then the retained messages, then this run's marker.
    feed.put(event(1), stale, event(2), presence("7"), presence("8"))
    settling = asyncio.create_task(order.settle(feed.messages(), take, acked.append))
    await asyncio.sleep(0.01)
    assert taken == [presence("7"), presence("8")]  # the retained state is handled at once
    assert not order.settled.is_set()

    feed.put(Message(topics.COORDINATOR_SYNC, order.token))
    assert await settling is None
    assert taken == [presence("7"), presence("8"), event(1), event(2)]
    assert order.settled.is_set() and order.held == 2 and order.stale_markers == 1 and not order.timed_out
    assert [m.payload for m in acked] == [b"an earlier run's token", order.token]


async def test_without_the_marker_the_held_events_go_after_the_timeout_and_nothing_is_lost() -> None:
    order = RetainedFirst(timeout_s=0.1)
    feed = Feed()
    taken: list[Message] = []

    async def take(message: Message) -> None:
        taken.append(message)

    messages = feed.messages()
    feed.put(event(1), presence("7"))
    with structlog.testing.capture_logs() as logs:
        reading = await order.settle(messages, take, lambda m: None)
    assert taken == [presence("7"), event(1)] and order.timed_out and order.settled.is_set()
    warning = [e for e in logs if e["event"] == "retained_sync_marker_missing"]
    assert len(warning) == 1 and topics.COORDINATOR_SYNC in warning[0]["fix"]

    # The read in flight when the timeout struck still gets the next message, then the iterator goes on.
    assert reading is not None and not reading.done()
    feed.put(event(2), event(3))
    assert await reading == event(2)
    assert await anext(messages) == event(3)


async def test_a_cancelled_settle_leaves_no_read_behind() -> None:
    order = RetainedFirst(timeout_s=5.0)
    feed = Feed()

    async def take(message: Message) -> None:
        pass

    settling = asyncio.create_task(order.settle(feed.messages(), take, lambda m: None))
    await asyncio.sleep(0.01)
    before = len(asyncio.all_tasks())
    settling.cancel()
    await asyncio.gather(settling, return_exceptions=True)
    await asyncio.sleep(0)
    assert settling.cancelled() and len(asyncio.all_tasks()) == before - 2  # it and its read
