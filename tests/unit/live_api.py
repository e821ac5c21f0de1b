"""A coordinator API served for real on a free local port, in a background thread (for clients
that are not asyncio: schemathesis over HTTP, headless Chromium, ``ftd status``)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from ftd.config import ApiConfig
from ftd.config.schema import NodeLabelsConfig
from ftd.coordinator.actions.scheduler import FakeScheduler
from ftd.coordinator.api import Api
from ftd.coordinator.daemon import Coordinator
from ftd.plugin.actions import ActionRecord, ActionRequest, ActionState
from tests.realparts import free_port
from tests.unit.test_api import TOKEN, make_coordinator, populate

__all__ = ["TOKEN", "live_api"]


@contextlib.contextmanager
def live_api(
    seed: Callable[[Coordinator], Awaitable[None]] | None = None,
    node_labels: list[NodeLabelsConfig] | None = None,
    hardware_profile: str = "",
) -> Iterator[str]:
    """Yield the base URL of a running API over a populated coordinator (nodes, a job, events,
    one finished action ``act-known``) with a FakeScheduler and the token :data:`TOKEN`; ``seed``
    adds to its state and ledger (a cluster at scale), ``node_labels`` is coordinator.node_labels,
    ``hardware_profile`` hardware.profile."""
    loop = asyncio.new_event_loop()
    port = free_port()
    scheduler = FakeScheduler()
    for node in ("node-1", "node-2"):
        scheduler.add_node(node)
    scheduler.add_job("42", ["node-1"])
    holder: dict[str, Any] = {}

    async def serve() -> None:
        coordinator = make_coordinator(scheduler, node_labels=node_labels, hardware_profile=hardware_profile)
        await populate(coordinator)
        await coordinator.ledger.save_action(
            ActionRecord(
                id="act-known",
                request=ActionRequest(
                    kind="drain_node", target="node-2", reason="xid 79 gpu 0000:3b:00.0", rule="xid_catalog"
                ),
                state=ActionState.SUCCEEDED,
                detail={"node": "node-2"},
            )
        )
        coordinator.state.mark_drained("node-2", "ftd: xid 79 gpu 0000:3b:00.0")
        if seed is not None:
            await seed(coordinator)
        await coordinator.bus.start()
        api = Api(coordinator, ApiConfig(port=port), token=TOKEN)
        await api.start()
        holder["api"], holder["coordinator"] = api, coordinator

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(serve(), loop).result(10)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:

        async def stop() -> None:
            await holder["api"].stop()
            await holder["coordinator"].engine.close()
            await holder["coordinator"].bus.stop()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
