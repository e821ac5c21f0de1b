"""``ftd agent --config PATH`` and ``ftd coordinator --config PATH``: the two long-running daemons.

Both load and validate the config first (exit 2 with every problem listed), configure logging,
then run until SIGTERM/SIGINT, on which they shut down cleanly (the agent publishes ``offline``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Any


def register(sub: Any) -> None:
    for name, handler, text in (
        ("agent", _agent, "run the node agent"),
        ("coordinator", _coordinator, "run the coordinator"),
    ):
        parser = sub.add_parser(name, help=text, description=text)
        parser.add_argument("--config", required=True, metavar="PATH", help="TOML config file")
        parser.set_defaults(handler=handler)


def _load(path: str) -> Any:
    from ftd.config import ConfigError, load_config
    from ftd.logs import configure

    try:
        config = load_config(path)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return None
    configure(config.log.level, json=config.log.json)
    return config


def _run_until_signal(main: Callable[[], Coroutine[Any, Any, None]]) -> int:
    async def runner() -> None:
        task = asyncio.create_task(main())
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(runner())
    return 0


def _agent(args: argparse.Namespace) -> int:
    config = _load(args.config)
    if config is None:
        return 2
    from ftd.agent.app import Agent, status_messages
    from ftd.bus.factory import make_mqtt_bus

    node = config.agent.resolved_node()
    will, birth = status_messages(node)
    bus = make_mqtt_bus(config.bus, client_id=f"ftd-agent-{node}", will=will, birth=birth)

    async def main() -> None:
        await Agent(config.agent, bus=bus, node=node).run()

    return _run_until_signal(main)


def _coordinator(args: argparse.Namespace) -> int:
    config = _load(args.config)
    if config is None:
        return 2
    from ftd.bus.factory import make_mqtt_bus
    from ftd.coordinator.app import Coordinator, coordinator_will, make_scheduler

    async def main() -> None:
        broker = None
        if config.bus.embedded:
            from ftd.bus.embedded import EmbeddedBroker

            broker = await EmbeddedBroker(config.bus.host, config.bus.port).start()
        bus = make_mqtt_bus(config.bus, client_id="ftd-coordinator", will=coordinator_will(), manual_ack=True)
        coordinator = Coordinator(config, bus=bus, scheduler=make_scheduler(config))
        try:
            await coordinator.run()
        finally:
            await coordinator.close()
            if broker is not None:
                await broker.stop()

    return _run_until_signal(main)
