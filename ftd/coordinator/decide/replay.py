"""The real engine in a sandbox: a simulated clock, an in-memory ledger, executors that only pretend.

What: :class:`Sandbox` builds the coordinator's own :class:`~ftd.coordinator.decide.engine.Engine` (same
plugin loading, same policy gate, same ledger code) but drives it on a :class:`SimClock` that moves
only when told, with an in-memory ledger its caller hands it (``ledger``, built on the sandbox's
clock: :func:`ftd.coordinator.ledger.sqlite.memory_store`; this stage holds the ledger through the
:class:`~ftd.coordinator.ledger.store.LedgerStore` seam and names no backend) and
:class:`SimulatedExecutors` registered for
every action kind: an allowed action "runs" for ``action_s`` simulated seconds and then succeeds,
and an allowed ``drain_node`` / ``resume_node`` marks the node in the cluster state the way the real
executors do. Nothing is published and nothing touches a scheduler.

Why: ``ftd rules test`` (what-if over recorded events) and the goodput simulator must decide
exactly as the live coordinator would. A second copy of dedupe -> evaluate -> gate would drift from
the real one; with one engine, a rule or policy change shows up in both.

Time: :meth:`SimClock.advance` fires due timers in order, setting the clock to each timer's due time
before waking its sleeper, so an action finishes (and its cooldown starts) at the simulated instant
it would have. Callers advance the clock to an event's timestamp before handing it to the engine.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ftd.config import Config, CoordinatorConfig
from ftd.coordinator.decide.engine import Engine
from ftd.coordinator.decide.plugins import collect_executors, make_plugin_manager
from ftd.coordinator.decide.policy import PolicyGate
from ftd.coordinator.ledger.store import LedgerStore
from ftd.coordinator.model.state import ClusterState
from ftd.plugin.actions import ActionKind, ActionRecord
from ftd.plugin.hookspecs import Executor
from ftd.plugin.settings import RuleSettings

#: Loop turns :meth:`Sandbox.finish` gives a newly started step to reach its first clock sleep.
_SETTLE_ROUNDS = 100


class SimClock:
    """A clock that moves only when advanced; ``await clock.sleep(s)`` wakes at simulated ``now + s``."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self._timers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._timers, (self.now + max(0.0, seconds), next(self._seq), future))
        await future

    @property
    def next_due(self) -> float | None:
        return self._timers[0][0] if self._timers else None

    async def advance(self, to: float) -> None:
        """Move to ``to`` (never backwards), waking each sleeper at its own due time, in order."""
        while self._timers and self._timers[0][0] <= to:
            due, _, future = heapq.heappop(self._timers)
            self.now = max(self.now, due)
            if not future.done():
                future.set_result(None)
            await asyncio.sleep(0)  # the woken task runs to its end before time moves on
        self.now = max(self.now, to)


class SimulatedExecutors:
    """One pretend executor for every kind: records nothing outside the engine, takes ``action_s``."""

    plugin_name = "simulated_executors"

    def __init__(
        self, clock: SimClock, state: ClusterState, *, action_s: float, kinds: Iterable[str]
    ) -> None:
        self.clock = clock
        self.state = state
        self.action_s = action_s
        self.kinds = sorted(set(kinds))

    def executors(self) -> dict[str, Executor]:
        return {kind: self._run for kind in self.kinds}

    async def _run(self, record: ActionRecord) -> dict[str, Any]:
        request = record.request
        if request.kind == ActionKind.DRAIN_NODE:
            self.state.mark_drained(request.target, request.reason)
        elif request.kind == ActionKind.RESUME_NODE:
            self.state.mark_drained(request.target, "", drained=False)
        await self.clock.sleep(self.action_s)
        return {"simulated": True}


@dataclass(frozen=True)
class SandboxHost:
    """What ``ftd_startup`` gets in a replay or simulation instead of the coordinator: the same
    ``config``, ``state``, ``engine`` and ``ledger`` attributes, and ``simulated = True`` so a plugin
    whose start-up opens connections can skip that."""

    config: Config
    state: ClusterState
    engine: Engine
    simulated: bool = True

    @property
    def ledger(self) -> LedgerStore:
        return self.engine.ledger


class Sandbox:
    """The coordinator's engine on a simulated clock, for replays and simulations.

    ``ledger`` builds the sandbox's ledger on the clock it is given (the sandbox's own):
    :func:`ftd.coordinator.ledger.sqlite.memory_store` for a fresh in-memory one."""

    def __init__(
        self,
        cfg: CoordinatorConfig,
        *,
        ledger: Callable[[Callable[[], float]], LedgerStore],
        action_s: float = 60.0,
        entry_points: bool = True,
        extra: tuple[object, ...] = (),
        start: float = 0.0,
    ) -> None:
        self.clock = SimClock(start)
        self.state = ClusterState()
        plugins = make_plugin_manager(
            disabled=cfg.disabled_rules,
            rule_dirs=cfg.rule_dirs,
            rules_file=cfg.rules_file,
            entry_points=entry_points,
            extra=extra,
        )
        # Plugins' own kinds are simulated too: a replay must not run a plugin's real side effects.
        kinds = {str(kind) for kind in ActionKind} | set(collect_executors(plugins))
        self.executors = SimulatedExecutors(self.clock, self.state, action_s=action_s, kinds=kinds)
        self.engine = Engine(
            state=self.state,
            ledger=ledger(self.clock),
            gate=PolicyGate.from_config(cfg, clock=self.clock),
            plugins=plugins,
            executors=self.executors.executors(),
            rule_settings=RuleSettings.from_policy(cfg.policy),  # as the live coordinator's
            slow_rule_s=float("inf"),
        )
        # The live coordinator calls ftd_startup once its engine exists, so a replay does too.
        self.host = SandboxHost(Config(coordinator=cfg), self.state, self.engine)
        self.engine.startup(self.host)

    async def settle(self) -> None:
        """Let actions started by the last decision reach their first await (their timers are set)."""
        await asyncio.sleep(0)

    async def finish(self) -> None:
        """Run the clock forward until every started action has finished. A plan's later step
        (a drain after the job's save and stop) starts only when the earlier one ends, in a task
        of its own: the loop runs until nothing is due and no task is left to reach a timer."""
        while True:
            while (due := self.clock.next_due) is not None:
                await self.clock.advance(due)
            if await self.engine.wait_idle(timeout=0):
                return
            for _ in range(_SETTLE_ROUNDS):  # let the next step run to its first sleep
                await asyncio.sleep(0)
                if self.clock.next_due is not None:
                    break
            else:
                await self.engine.wait_idle()  # waiting on something other than the clock
                return
