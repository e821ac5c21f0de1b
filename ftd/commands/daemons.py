"""``ftd agent --config PATH`` and ``ftd coordinator --config PATH``: the two long-running daemons.

Both check the config first exactly as ``ftd check-config --for DAEMON`` does
(:func:`ftd.commands.config_check.check_config_file`: the file, the rules between its options, and the files,
directories and rules it names), configure logging, then run until SIGTERM/SIGINT, on which they
shut down cleanly (the agent publishes ``offline``).

Start-up failures: anything that stops a daemon before it is running (its ``ready`` callback) is
one clean error on stderr, never a traceback, and exit status 2: every config problem at once as
``PATH: dotted.path: message`` (the lines ``check-config`` prints), or, for a failure the checks
could not foresee (a live agent already on the socket, a port in use, a corrupt ledger),
``PATH: cannot start: ...``. Status 2 lets a unit stop restarting on it
(``RestartPreventExitStatus=2``); the traceback is still logged at ``log.level = "debug"``. A
failure after start-up is a crash, raised as before (systemd restarts the daemon).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ftd.config import Config, ConfigError

#: What a daemon's main coroutine gets: the callback that says it is running.
Ready = Callable[[], None]


def register(sub: Any) -> None:
    for name, handler, text in (
        ("agent", _agent, "run the node agent"),
        ("coordinator", _coordinator, "run the coordinator"),
    ):
        parser = sub.add_parser(name, help=text, description=text)
        parser.add_argument("--config", required=True, metavar="PATH", help="TOML config file")
        parser.set_defaults(handler=handler)


def _load(path: str, role: str) -> Config | None:
    """The checked config for ``role``, with logging configured; ``None`` once the problems are printed."""
    from ftd.commands.config_check import check_config_file
    from ftd.logs import configure

    try:
        config = check_config_file(path, roles=(role,)).config
    except Exception as exc:  # a start-up failure, whatever it is: one clean error
        print(_startup_error(exc, path).report(), file=sys.stderr)
        return None
    configure(config.log.level, json=config.log.json)
    return config


def _startup_error(exc: BaseException, path: str) -> ConfigError:
    """``exc`` as the one error a daemon that cannot start prints (see the module docstring)."""
    from ftd.config import ConfigError, Problem

    if isinstance(exc, ConfigError):
        return ConfigError(exc.problems, path)
    return ConfigError([Problem("", f"cannot start: {type(exc).__name__}: {exc}")], path)


def _run_until_signal(main: Callable[[Ready], Coroutine[Any, Any, None]], path: str) -> int:
    started = False

    def ready() -> None:
        nonlocal started
        started = True

    async def runner() -> None:
        task = asyncio.create_task(main(ready))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    try:
        asyncio.run(runner())
    except Exception as exc:
        if started:
            raise
        from ftd.logs import get_logger

        get_logger(__name__).debug("start-up failed", exc_info=exc)
        print(_startup_error(exc, path).report(), file=sys.stderr)
        return 2
    return 0


def _agent(args: argparse.Namespace) -> int:
    config = _load(args.config, "agent")
    if config is None:
        return 2

    async def main(ready: Ready) -> None:
        from ftd.agent.addresses import node_addresses
        from ftd.agent.app import status_messages
        from ftd.agent.wiring import build_agent
        from ftd.bus.factory import make_mqtt_bus

        node = config.agent.resolved_node()
        rack_broker = config.bus.rack_broker or ""
        will, birth = status_messages(node, rack_broker, node_addresses(config.agent))
        bus = make_mqtt_bus(config.bus, client_id=f"ftd-agent-{node}", will=will, birth=birth)
        await build_agent(
            config.agent, bus=bus, node=node, rack_broker=rack_broker, hardware=config.hardware
        ).run(ready)

    return _run_until_signal(main, args.config)


def _coordinator(args: argparse.Namespace) -> int:
    config = _load(args.config, "coordinator")
    if config is None:
        return 2

    async def main(ready: Ready) -> None:
        from ftd.bus.base import Bus
        from ftd.bus.factory import make_mqtt_bus
        from ftd.coordinator.daemon import tune_collector
        from ftd.coordinator.wiring import build, coordinator_will, make_scheduler

        tune_collector()

        broker = None
        try:
            if config.bus.embedded:
                from ftd.bus.embedded import EmbeddedBroker

                broker = await EmbeddedBroker(config.bus.host, config.bus.port).start()
            if config.coordinator.ha.ledger == "postgresql":  # active/standby (ftd.coordinator.ha.runner)
                from ftd.coordinator.ha.runner import HaRunner, view_bus_maker

                def ha_bus() -> Bus:
                    return make_mqtt_bus(
                        config.bus, client_id="ftd-coordinator", will=coordinator_will(), manual_ack=True
                    )

                runner = HaRunner(
                    config,
                    make_bus=ha_bus,
                    scheduler=make_scheduler(config),
                    make_view_bus=view_bus_maker(config),  # None: no login of its own, no view
                )
                await runner.run(ready)
                return
            bus = make_mqtt_bus(
                config.bus, client_id="ftd-coordinator", will=coordinator_will(), manual_ack=True
            )
            coordinator = build(config, bus=bus, scheduler=make_scheduler(config))
            try:
                await coordinator.run(ready)
            finally:
                await coordinator.close()
        finally:
            if broker is not None:
                await broker.stop()

    return _run_until_signal(main, args.config)
