"""A cancelled wait stays cancelled.

``Engine.close()`` (shutdown, or a leader that lost its lease) cancels every running action and
expects them to stop where they are, to be resumed by the next leader. On Python 3.11,
``asyncio.wait_for`` returns normally when the cancel arrives in the same loop tick as the result it
waits for, and the cancel is gone: an action waiting for an agent's answer then carried on (CI saw a
GPU reset finish on a coordinator that had been closed three seconds before). The daemons therefore
bound their waits with ``asyncio.timeout``, and ruff bans ``asyncio.wait_for`` in ``ftd/`` (TID251).
Likewise a ``close()`` that waits for the tasks it cancelled uses ``gather(..., return_exceptions=True)``,
not ``suppress(CancelledError)``, which would swallow a cancel of ``close()`` itself.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from ftd.coordinator.actions.acks import AckBook
from ftd.coordinator.actions.scheduler import FakeScheduler
from ftd.coordinator.intake.placement import Placement
from ftd.events import Ack

ROOT = Path(__file__).resolve().parents[2]


async def _cancel_as_the_ack_lands(ticks_before: int) -> asyncio.Task[object]:
    book = AckBook()
    waiter = asyncio.create_task(book.wait("d-1", [0], timeout=5.0))
    for _ in range(ticks_before):
        await asyncio.sleep(0)
    book.record(Ack(directive_id="d-1", job="", rank=0, node="node-1", ok=True))
    assert not waiter.done()
    waiter.cancel()  # same tick as the answer
    return waiter


@pytest.mark.parametrize("ticks_before", [0, 1, 2, 3])
async def test_an_ack_arriving_with_the_cancel_does_not_swallow_it(ticks_before: int) -> None:
    waiter = await _cancel_as_the_ack_lands(ticks_before)
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert waiter.cancelled()


async def test_a_wait_with_no_answer_still_times_out() -> None:
    outcome = await AckBook().wait("d-2", [0, 1], timeout=0.05)
    assert outcome.missing == frozenset({0, 1}) and not outcome.complete


def test_the_daemons_never_use_asyncio_wait_for() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--select", "TID251", "--output-format", "concise", "ftd"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


async def test_a_cancelled_close_is_not_swallowed_while_it_waits_for_its_own_tasks() -> None:
    """``close()`` cancels its tasks and waits for them. Waiting with ``suppress(CancelledError)``
    also swallowed a cancel of ``close()`` itself (the two arrive as the same exception); waiting with
    ``gather(..., return_exceptions=True)`` keeps them apart."""
    placement = Placement(FakeScheduler(), retry_s=60.0)

    async def again(item: str) -> None:
        pass

    assert placement.hold("a presence", "node-1", ["7"], again, lambda item: None)
    await asyncio.sleep(0)
    closing = asyncio.create_task(placement.close())
    await asyncio.sleep(0)  # close() now waits for the held message's task
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert closing.cancelled() and placement.held == 0
