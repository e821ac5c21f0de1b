"""The job model: one large training job over weeks of simulated time, faults from a trace.

What: :func:`simulate` runs one policy over one trace and returns a :class:`Result` (ETTR, lost
time by cause and by fault category, restarts, nodes drained, mean time to recover). Two policies:

- ``no_ftd``: a crash ends the job after ``crash_detect_s`` (the launcher), a hang after the NCCL
  watchdog (``watchdog_s``), a silent fault after ``silent_detect_s`` (a human); the job restarts
  from its last periodic checkpoint; a node that is still up is handed back to the job with
  probability ``same_node_p`` (the scheduler does not know it is bad) and then fails again after
  ``recurrence_mean_s`` on average; otherwise a human sends it to repair.
- ``ftd``: every signal of a fault goes through the real engine (:mod:`.bridge`). An allowed
  ``checkpoint_restart`` of the job ends it ``ftd_detect_s`` after the signal (if that is sooner than
  the launcher or watchdog would); the job saves first when the fault leaves it able to (warnings
  before the failure, ``can_save`` faults) and keeps its progress; ``exclude`` or an allowed
  ``drain_node`` takes the node out (drained nodes are repaired and pass preflight, ``preflight_s``,
  before they return); an allowed ``gpu_reset`` clears the fault with the category's
  ``reset_clears`` probability. Whatever the engine does not act on (no rule, suppressed, dry run)
  falls back to what happens without ftd.
- ``ftd`` with ``in_allocation`` (the job runs under ``ftd run``, issue #24): a restart the engine
  decided happens in the job's allocation: on the same nodes, or with one of the allocation's
  ``alloc_spares`` hot spares taking the failed node's slot, and costs :func:`.inalloc.in_allocation_s`
  (the ``ftd bench recovery`` figures) instead of ``restart_s``; with no hot spare left the scheduler
  requeues it as before, and the new allocation holds N+K nodes again (spares from the free pool,
  never waited for). Nothing else refills a running allocation's spares (a Slurm allocation does not
  grow), unless ``spares_return`` (a node the job left becomes its spare again when it is back from
  repair or preflight) or ``spare_replenish_s`` > 0 (a free node joins that long after each spare
  used) say otherwise.

Time: the job's position ``x`` moves with the wall clock while it runs; a cycle is
``checkpoint_interval_s`` of training then ``save_s`` of blocking save (checkpoints are arithmetic,
not events). Progress at ``x`` is the training time in it; a rollback moves ``x`` back to the last
finished checkpoint. A fault at ``t`` holds the job down until ``t + detection + [save] + restart +
load + [wait for a spare]``; a fault while it is already down extends that (each cause charged only
for the time it adds). So wall time = kept progress + checkpoint overhead + lost work + downtime,
exactly, and ETTR = kept progress / wall time.

Why this shape: the checkpoint phase lives in progress (step-based saves), each fault draws from its
own random stream, and a fault's cost does not depend on the job's position: so with the same seed,
one more fault never makes ETTR higher (the property tests check it), and zero faults give
``interval / (interval + save)``.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import Counter, deque
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from ftd.sim.goodput.faults import Category, Fault, FaultMix, Signal, Variant
from ftd.sim.goodput.inalloc import BENCH_COSTS, RestartCosts, in_allocation_s

if TYPE_CHECKING:
    from ftd.sim.goodput.bridge import EngineBridge

POLICIES = ("no_ftd", "ftd")
CAUSES = ("checkpoint_overhead", "lost_work", "detection", "save_on_signal", "restart", "spare_wait")


@dataclass(frozen=True)
class Params:
    """The job and the set-up (defaults: the ``meta`` scenario of the Llama 3 mix)."""

    job_gpus: int = 16384
    gpus_per_node: int = 8
    spare_nodes: int = 64
    days: float = 54.0
    checkpoint_interval_s: float = 900.0
    save_s: float = 10.0
    load_s: float = 60.0
    restart_s: float = 300.0
    watchdog_s: float = 600.0
    crash_detect_s: float = 60.0
    same_node_p: float = 0.3
    silent_detect_s: float = 3600.0
    recurrence_mean_s: float = 1800.0
    ftd_detect_s: float = 0.0089
    preflight_s: float = 600.0
    # The job under `ftd run` (issue #24): ftd's restarts happen in the allocation (in place, or a hot
    # spare of the allocation takes the failed node's slot) when a spare is left; see .inalloc.
    in_allocation: bool = False
    alloc_spares: int = 0  # hot spares the job's allocation holds (N+K nodes, trains on N)
    spare_replenish_s: float = 0.0  # >0: a used hot spare is replaced from the pool this much later
    spares_return: bool = False  # a node the job left rejoins its allocation as a spare when it is back
    warm_spares: bool = True  # the supervisors keep pre-started interpreters (ftd run --warm)

    @property
    def nodes(self) -> int:
        return math.ceil(self.job_gpus / self.gpus_per_node)

    @property
    def horizon_s(self) -> float:
        return self.days * 86400.0

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def replace(self, **changes: Any) -> Params:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return Params(**values)


def from_scenario(scenario: dict[str, Any], **overrides: Any) -> Params:
    known = set(Params.names())
    values = {k: v for k, v in scenario.items() if k in known}
    values.update({k: v for k, v in overrides.items() if v is not None})
    return Params(**values)


@dataclass
class Result:
    policy: str
    params: Params
    faults: int = 0  # faults of the trace (recurrences not counted)
    interruptions: int = 0  # times the job stopped (failures, recurrences, proactive moves)
    recurrences: int = 0  # failures of a bad node the job was put back on
    proactive: int = 0  # moves off a node on a warning, before it failed
    saves_on_signal: int = 0
    nodes_drained: int = 0  # nodes sent to repair (by ftd's drain or by a human)
    restarts_in_allocation: int = 0  # ftd restarts by the job's supervisors (in place or a hot spare)
    restarts_in_place: int = 0  # ... of which on the same nodes
    restarts_requeued: int = 0  # ftd restarts of an in-allocation job through the scheduler: no spare
    spares_used: int = 0  # hot spares that took a failed node's slot
    spares_replenished: int = 0  # hot spares added back (a node returned, the rate, a requeue)
    progress_s: float = 0.0
    lost: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0.0))
    lost_by_category: dict[str, float] = field(default_factory=dict)
    recover_s: list[float] = field(default_factory=list)
    verdicts: Counter[tuple[str, str]] = field(default_factory=Counter)

    @property
    def ettr(self) -> float:
        return self.progress_s / self.params.horizon_s

    @property
    def mttr_s(self) -> float:
        return sum(self.recover_s) / len(self.recover_s) if self.recover_s else 0.0

    def to_json(self) -> dict[str, Any]:
        gpus = self.params.job_gpus
        return {
            "policy": self.policy,
            "ettr": self.ettr,
            "faults": self.faults,
            "interruptions": self.interruptions,
            "restarts": self.interruptions,
            "recurrences": self.recurrences,
            "proactive_moves": self.proactive,
            "saves_on_signal": self.saves_on_signal,
            "nodes_drained": self.nodes_drained,
            "restarts_in_allocation": self.restarts_in_allocation,
            "restarts_in_place": self.restarts_in_place,
            "restarts_requeued": self.restarts_requeued,
            "spares_used": self.spares_used,
            "spares_replenished": self.spares_replenished,
            "mttr_s": self.mttr_s,
            "lost_hours": {k: v / 3600.0 for k, v in self.lost.items()},
            "lost_gpu_hours": {k: v * gpus / 3600.0 for k, v in self.lost.items()},
            "lost_fraction": {k: v / self.params.horizon_s for k, v in self.lost.items()},
            "lost_fraction_by_category": {
                k: v / self.params.horizon_s for k, v in sorted(self.lost_by_category.items())
            },
            "engine_verdicts": [
                {"kind": k, "verdict": v, "count": n} for (k, v), n in sorted(self.verdicts.items())
            ],
        }


class _Job:
    """Where the job is (position ``x``), until when it is down, and the charge for each cause."""

    def __init__(self, params: Params, result: Result) -> None:
        self.p = params
        self.r = result
        self.cycle = params.checkpoint_interval_s + params.save_s
        self.x = 0.0
        self.t = 0.0
        self.down_until = 0.0

    def progress(self, x: float) -> float:
        k, rem = divmod(x, self.cycle)
        return k * self.p.checkpoint_interval_s + min(rem, self.p.checkpoint_interval_s)

    def advance(self, t: float) -> None:
        t = min(t, self.p.horizon_s)
        start = max(self.t, self.down_until)
        if t > start:
            self.x += t - start
        self.t = max(self.t, t)

    def running(self, t: float) -> bool:
        return t >= self.down_until

    def interrupt(self, t: float, parts: list[tuple[str, float]], *, keep: bool, category: str) -> float:
        """Stop the job at ``t`` for ``parts`` (cause, seconds) in order; roll back unless ``keep``.
        Returns the time it is back."""
        self.advance(t)
        by_cat = self.r.lost_by_category
        if not keep:
            checkpoint = (self.x // self.cycle) * self.cycle
            lost = self.x - checkpoint
            self.x = checkpoint
            self.r.lost["lost_work"] += lost
            by_cat[category] = by_cat.get(category, 0.0) + lost
        horizon = self.p.horizon_s
        new_from = max(self.down_until, t)
        start = t
        for cause, seconds in parts:
            end = start + seconds
            added = max(0.0, min(end, horizon) - max(start, new_from))
            self.r.lost[cause] += added
            by_cat[category] = by_cat.get(category, 0.0) + added
            start = end
        self.down_until = max(self.down_until, start)
        self.r.interruptions += 1
        self.r.recover_s.append(start - t)
        return start

    def finish(self) -> None:
        self.advance(self.p.horizon_s)
        progress = self.progress(self.x)
        self.r.progress_s = progress
        self.r.lost["checkpoint_overhead"] = max(0.0, self.x - progress)


class Simulation:
    """One policy over one trace (see the module docstring). ``bridge`` is None for ``no_ftd``."""

    def __init__(
        self,
        mix: FaultMix,
        params: Params,
        trace: list[Fault],
        bridge: EngineBridge | None = None,
        costs: RestartCosts = BENCH_COSTS,
    ) -> None:
        self.mix = mix
        self.p = params
        self.costs = costs
        self.trace = trace
        self.bridge = bridge
        self.policy = "ftd" if bridge is not None else "no_ftd"
        self.result = Result(self.policy, params, faults=len(trace))
        self.job = _Job(params, self.result)
        n = params.nodes
        self.slots = list(range(n))
        self.slot_of = {node: slot for slot, node in enumerate(self.slots)}
        self.pool: deque[int] = deque(range(n, n + params.spare_nodes))
        # The allocation's hot spares (ftd only: without ftd nothing would ever start them).
        self.supervised = bridge is not None and params.in_allocation
        self.hot: deque[int] = deque()
        if self.supervised:
            self._fill_hot(first=True)
        self.bad: dict[int, str] = {}  # node -> category of the fault it carries
        self.repairing: dict[int, float] = {}  # node -> when it is back
        self.bound: dict[int, int] = {}  # fault id -> the node it hit (bound at its first signal)
        self.recur_pending: set[int] = set()
        self.rngs: dict[int, random.Random] = {}
        self.queue: list[tuple[float, int, str, Any]] = []
        self.seq = itertools.count()
        self.recur_ids = itertools.count(1_000_000_000)

    # --- helpers ---------------------------------------------------------------------------

    def _push(self, t: float, what: str, payload: Any) -> None:
        heapq.heappush(self.queue, (t, next(self.seq), what, payload))

    def _rng(self, fault: Fault) -> random.Random:
        rng = self.rngs.get(fault.id)
        if rng is None:
            rng = self.rngs[fault.id] = random.Random(fault.seed)
        return rng

    def _gpu(self, fault: Fault) -> int:
        """The GPU a fault's events name (its own draw: policies that feed more events or fewer
        still share every other draw of the fault)."""
        return random.Random(fault.seed ^ 0x5BD1E995).randrange(self.p.gpus_per_node)

    def _category(self, fault: Fault) -> Category:
        return self.mix.categories[fault.category]

    def _variant(self, fault: Fault) -> Variant:
        return self._category(fault).variants[fault.variant]

    def _node_of(self, fault: Fault) -> int:
        node = self.bound.get(fault.id)
        if node is None:
            node = self.bound[fault.id] = self.slots[fault.slot]
        return node

    # --- the run ---------------------------------------------------------------------------

    async def run(self) -> Result:
        if self.bridge is not None:
            for slot, node in enumerate(self.slots):
                self.bridge.place(node, slot)
        for fault in self.trace:
            variant = self._variant(fault)
            warned = [s for s in variant.signals if s.at_s < 0]
            for signal in warned:
                self._push(max(0.0, fault.t + signal.at_s), "warn", (fault, signal))
            self._push(fault.t, "fail", fault)
        horizon = self.p.horizon_s
        while self.queue and self.queue[0][0] < horizon:
            t, _, what, payload = heapq.heappop(self.queue)
            if what == "warn":
                await self._warning(t, *payload)
            elif what == "fail":
                await self._failure(t, payload)
            elif what == "back":
                self._back(t, payload)
            elif what == "recur":
                await self._recur(t, payload)
            elif what == "refill":
                self._fill_hot(limit=1)
        self.job.finish()
        return self.result

    def _back(self, t: float, node: int) -> None:
        if self.repairing.get(node) != t:
            return  # taken straight from repair into the job, or sent again
        del self.repairing[node]
        if self.supervised and self.p.spares_return and len(self.hot) < self.p.alloc_spares:
            self.hot.append(node)  # the failed node, repaired or checked, is the job's spare again
            self.result.spares_replenished += 1
        else:
            self.pool.append(node)
        if self.bridge is not None:
            self.bridge.node_back(node)

    def _fill_hot(self, limit: int | None = None, *, first: bool = False) -> None:
        """Hot spares from the cluster's free nodes, up to ``alloc_spares`` (at most ``limit``), none
        waited for: the first allocation, a requeue's new allocation (N+K again), the refill rate."""
        added = 0
        while self.pool and len(self.hot) < self.p.alloc_spares and (limit is None or added < limit):
            self.hot.append(self.pool.popleft())
            added += 1
        if not first:
            self.result.spares_replenished += added

    async def _warning(self, t: float, fault: Fault, signal: Signal) -> None:
        if self.bridge is None:
            return
        node = self._node_of(fault)
        gpu = self._gpu(fault)
        slot = self.slot_of.get(node, -1)
        decision = await self.bridge.feed(self.bridge.event(signal, node, t, gpu, slot))
        self.result.verdicts.update(decision.verdicts)
        if node not in self.slot_of or not decision.restart:
            return
        p = self.p
        moved = decision.exclude or decision.drain
        parts = [("detection", p.ftd_detect_s), ("save_on_signal", p.save_s)]
        self.result.saves_on_signal += 1
        if moved:
            self.result.proactive += 1
            parts += self._move(t, node, drained=decision.drain, reset=decision.reset, fault=fault, ftd=True)
        else:
            parts += self._in_place(ftd=True)
        back = self.job.interrupt(t, parts, keep=True, category=fault.category)
        self._schedule_recurrences(back)

    async def _failure(self, t: float, fault: Fault, recurrence: bool = False) -> None:
        category = self._category(fault)
        variant = self._variant(fault)
        node = self._node_of(fault)
        p = self.p
        if category.node_fault:
            self.bad[node] = category.name
        if node not in self.slot_of:
            return  # ftd moved the job off this node before it failed
        rng = self._rng(fault)
        gpu = self._gpu(fault)
        if category.silent:
            fallback = p.silent_detect_s
        else:
            fallback = p.crash_detect_s if variant.mode == "crash" else p.watchdog_s
        decided: float | None = None
        decision_exclude = decision_drain = decision_reset = False
        if self.bridge is not None:
            slot = self.slot_of[node]
            for signal in sorted((s for s in variant.signals if s.at_s >= 0), key=lambda s: s.at_s):
                decision = await self.bridge.feed(self.bridge.event(signal, node, t + signal.at_s, gpu, slot))
                self.result.verdicts.update(decision.verdicts)
                decision_drain = decision_drain or decision.drain
                decision_reset = decision_reset or decision.reset
                if decision.restart and decided is None:
                    decided = signal.at_s + p.ftd_detect_s + decision.delay_s
                    decision_exclude = decision.exclude
        parts: list[tuple[str, float]] = []
        keep = False
        if decided is not None and decided < fallback:
            parts.append(("detection", decided))
            if variant.can_save:
                keep = True
                self.result.saves_on_signal += 1
                parts.append(("save_on_signal", p.save_s))
        else:
            parts.append(("detection", fallback))
        # Who takes the node out: the scheduler (node down), ftd (exclude/drain), a human (silent);
        # otherwise it stays with probability same_node_p when it is bad.
        by_ftd = decision_exclude or decision_drain
        by_others = category.node_down or category.silent
        if not by_ftd and not by_others and category.node_fault and rng.random() >= p.same_node_p:
            by_others = True  # the scheduler or a human took another node; the bad one goes to repair
        ftd = decided is not None  # the engine's checkpoint_restart drives the restart
        if by_ftd or by_others:
            # ftd excluding without a drain hands the node back to the pool (after its GPU reset)
            drained = decision_drain or by_others
            parts += self._move(t, node, drained=drained, reset=decision_reset, fault=fault, ftd=ftd)
        else:
            if decision_reset and category.node_fault and rng.random() < category.reset_clears:
                self.bad.pop(node, None)
            parts += self._in_place(ftd=ftd)
        back = self.job.interrupt(t, parts, keep=keep, category=fault.category)
        if recurrence:
            self.result.recurrences += 1
        self._schedule_recurrences(back)

    def _in_allocation_s(self) -> float:
        return in_allocation_s(self.p.load_s, warm=self.p.warm_spares, costs=self.costs)

    def _requeue(self) -> list[tuple[str, float]]:
        return [("restart", self.p.restart_s + self.p.load_s)]

    def _in_place(self, *, ftd: bool) -> list[tuple[str, float]]:
        """The job restarts on the same nodes: by its supervisors (ftd, under ``ftd run``) or requeued."""
        if not (ftd and self.supervised):
            return self._requeue()
        self.result.restarts_in_allocation += 1
        self.result.restarts_in_place += 1
        return [("restart", self._in_allocation_s())]

    def _move(
        self, t: float, node: int, *, drained: bool, reset: bool, fault: Fault, ftd: bool
    ) -> list[tuple[str, float]]:
        """The job leaves ``node``: a hot spare of the allocation takes its slot when ftd restarts a job
        under ``ftd run`` and one is left; otherwise the scheduler requeues it onto a spare node."""
        if ftd and self.supervised and self.hot:
            slot = self._take_out(t, node, drained=drained, reset=reset, fault=fault)
            self._put_in(slot, self.hot.popleft())
            self.result.restarts_in_allocation += 1
            self.result.spares_used += 1
            if self.p.spare_replenish_s > 0:
                self._push(t + self.p.spare_replenish_s, "refill", None)
            return [("restart", self._in_allocation_s()), ("spare_wait", 0.0)]
        wait = self._replace(t, node, drained=drained, reset=reset, fault=fault)
        if ftd and self.supervised:
            self.result.restarts_requeued += 1
            self._fill_hot()  # the requeued job's new allocation holds N+K nodes again
        return [*self._requeue(), ("spare_wait", wait)]

    def _put_in(self, slot: int, spare: int) -> None:
        self.slots[slot] = spare
        self.slot_of[spare] = slot
        if self.bridge is not None:
            self.bridge.place(spare, slot)

    def _replace(self, t: float, node: int, *, drained: bool, reset: bool, fault: Fault) -> float:
        """Take ``node`` out of the job and put a spare in its slot; returns the wait for one."""
        slot = self._take_out(t, node, drained=drained, reset=reset, fault=fault)
        wait = 0.0
        if self.pool and self.pool[0] != node:
            spare = self.pool.popleft()
        elif len(self.pool) > 1:
            spare = self.pool[1]
            del self.pool[1]
        elif self.repairing:
            spare, ready = min(self.repairing.items(), key=lambda kv: kv[1])
            del self.repairing[spare]
            wait = max(0.0, ready - t)
            if self.bridge is not None:
                self.bridge.node_back(spare)
        else:  # nothing else exists: the job takes the node back
            self.pool.remove(node)
            spare = node
        self._put_in(slot, spare)
        return wait

    def _take_out(self, t: float, node: int, *, drained: bool, reset: bool, fault: Fault) -> int:
        """Take ``node`` out of the job (to repair, or back to the pool after a preflight); its slot."""
        category = self._category(fault)
        slot = self.slot_of.pop(node)
        if self.bridge is not None:
            self.bridge.unplace(node)
        if not drained and reset and node in self.bad and self._rng(fault).random() < category.reset_clears:
            self.bad.pop(node, None)
        if not drained and node in self.bad and self.bridge is not None:
            drained = True  # ftd's preflight before the node returns finds the fault: repair
        if drained:
            self.result.nodes_drained += 1
            repair = category.repair_h * 3600.0 if node in self.bad or category.node_down else 0.0
            repair += self.p.preflight_s if self.bridge is not None else 0.0
            self.bad.pop(node, None)
            self.repairing[node] = t + repair
            self._push(t + repair, "back", node)
        elif self.bridge is not None:  # excluded, healthy (or reset): back after preflight
            self.repairing[node] = t + self.p.preflight_s
            self._push(t + self.p.preflight_s, "back", node)
        else:
            self.pool.append(node)
        return slot

    def _schedule_recurrences(self, back: float) -> None:
        """A bad node in the job fails again after it restarts (recurrence_mean_s on average)."""
        for node, category in self.bad.items():
            if node in self.slot_of and node not in self.recur_pending:
                self.recur_pending.add(node)
                rng = random.Random(f"{node}:{back}:{category}")
                self._push(back + rng.expovariate(1.0 / self.p.recurrence_mean_s), "recur", node)

    async def _recur(self, t: float, node: int) -> None:
        self.recur_pending.discard(node)
        name = self.bad.get(node)
        if name is None or node not in self.slot_of:
            return
        if not self.job.running(t):
            self._push(self.job.down_until + 1.0, "recur", node)
            self.recur_pending.add(node)
            return
        category = self.mix.categories[name]
        variant = random.Random(f"{node}:{t}").choices(
            range(len(category.variants)), [v.weight for v in category.variants]
        )[0]
        fault = Fault(
            next(self.recur_ids), t, name, variant, self.slot_of[node], hash((node, t)) & 0xFFFFFFFF
        )
        self.bound[fault.id] = node
        await self._failure(t, fault, recurrence=True)


async def simulate(
    mix: FaultMix,
    params: Params,
    trace: list[Fault],
    bridge: EngineBridge | None = None,
    costs: RestartCosts = BENCH_COSTS,
) -> Result:
    """Run one policy (``bridge`` None: no ftd) over ``trace``; ``costs``: the in-allocation restart's."""
    sim = Simulation(mix, params, trace, bridge, costs)
    try:
        return await sim.run()
    finally:
        if bridge is not None:
            await bridge.close()


__all__ = ["CAUSES", "POLICIES", "Params", "Result", "Simulation", "from_scenario", "simulate"]
