"""The decision engine: event -> rules -> policy gate -> ledger -> executor.

For each event: drop it if the ledger has seen its id; ask every rule (each in isolation); pass each
proposed action through the policy gate; record the verdict in the ledger *before* anything runs;
then run allowed actions concurrently, each with its executor, and record how they ended. Nothing
here does I/O of its own except through the ledger and the executors it was given.

Observers (the demo's timeline, metrics, the API's live view, ``ftd rules test``) subscribe with
:meth:`Engine.observe` and receive ``(what, payload)``: ``("event", Event)`` for each new event,
``("action", ActionRecord)`` for each decision and state change, ``("decision", seconds)`` once per
event (receipt -> verdicts; the API feeds a bounded Prometheus histogram, a bench keeps its own
samples: the engine keeps none) and ``("rule_error", (event, rule, error))``. An observer may be a
coroutine function (the reconciler records drains in the ledger): the engine awaits it. Observers
must not call back into the engine's entry points directly (schedule a task instead, as
return-to-service does): they run inside a decision.

The ledger is asynchronous (:class:`~ftd.coordinator.ledger.store.LedgerStore`: its PostgreSQL
backend must not stall the event loop). Decisions -- :meth:`Engine.handle_event`, :meth:`Engine.submit`,
:meth:`Engine.approve`, :meth:`Engine.reject`, :meth:`Engine.resume_unfinished` -- therefore hold one
lock each from the gate's verdict to the record in the ledger, so two of them never interleave at a
ledger round trip (a bus event and an operator's approval deciding against the same budget); with
the SQLite backend nothing suspends and the lock is never contended. Lock order: the decision lock
first, then a ledger transaction (:meth:`Engine.handle_events`), never the other way round.
:meth:`Engine.load` reads the engine's memory (gate, held approvals, cluster history) from the
ledger before the first decision.

One engine everywhere: the live coordinator, ``ftd rules test`` and the goodput simulator all run
this class. Time is the policy gate's clock (``PolicyGate(clock=...)``): the wall clock live, the
events' own timestamps in a replay; the ledger (SQLite, ``:memory:`` for a replay) takes the same
clock, and the executors are whatever the caller registered (simulated ones in a replay).

After the rules have decided on an event it is folded into the cluster history
(:meth:`ClusterState.apply_event`), so rules see the past, not the event itself, in
``view.node_history``; the history is rebuilt from the ledger's recent events at start-up (except the
coordinator's notes about itself, node :data:`~ftd.coordinator.ledger.store.NOTICE_NODE`).

Approval: an action whose kind needs a human (``policy.approval_required_kinds``) is recorded as
``awaiting_approval``; :meth:`Engine.approve` re-checks it with the gate (the cluster may have
changed) and starts it, :meth:`Engine.reject` closes it as ``suppressed`` with the operator's
reason (the key then cools down like a finished action, so the rule does not ask again at once).

Plans (:mod:`ftd.coordinator.model.plan`): the actions one event's rules ask for are decided together and,
when their order matters (a job to stop and a node action such as ``gpu_reset`` or ``drain_node``),
run as one plan: each action is still one record with its own executor, but the engine runs a
phased executor's phases apart and starts each phase only once what it depends on is over (the
job's save and stop before the node's reset or drain, those before the job's requeue). The plan is
recorded in the ledger and rebuilt by :meth:`Engine.resume_unfinished`. :meth:`Engine.submit` (manual
actions) still starts one action on its own, at once.

An action of a kind no executor carries out (a drain with ``coordinator.scheduler = "none"``) is
turned into a notification saying what should be done by hand, or, asked by an operator, fails with
a sentence (:mod:`ftd.coordinator.decide.fallback`).

``checkpoint`` (save without stopping) runs on the ``checkpoint_restart`` executor when no executor
is registered for it: that executor skips stop and requeue for this kind (``params["stop"]``).
Plugins learn how executed actions ended through ``ftd_action_completed`` (each implementation
called on its own; a failure is logged).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import pluggy

from ftd.coordinator.decide import drill, fallback, save_path
from ftd.coordinator.decide.plugins import call_each, evaluate
from ftd.coordinator.decide.policy import PolicyGate
from ftd.coordinator.ledger.store import NOTICE_NODE, LedgerStore
from ftd.coordinator.model import plan as plans
from ftd.coordinator.model.plan import Dependency, Plan, Progress
from ftd.coordinator.model.state import ClusterState
from ftd.events import Event, new_id
from ftd.logs import get_logger
from ftd.plugin.actions import ActionRecord, ActionRequest, ActionState
from ftd.plugin.hookspecs import Executor
from ftd.plugin.settings import RuleSettings

log = get_logger(__name__)

Observer = Callable[[str, Any], "Awaitable[None] | None"]  # ("event" | "action", payload)


class Engine:
    def __init__(
        self,
        *,
        state: ClusterState,
        ledger: LedgerStore,
        gate: PolicyGate,
        plugins: pluggy.PluginManager,
        executors: Mapping[str, Executor],
        rule_settings: RuleSettings | None = None,
        slow_rule_s: float = 0.05,
    ) -> None:
        self.state = state
        # What the configuration says to the rules, handed to each ftd_evaluate (typed, per engine)
        self.rule_settings = rule_settings if rule_settings is not None else RuleSettings()
        self.slow_rule_s = slow_rule_s  # a rule slower than this on one event is logged
        self.ledger = ledger
        self.gate = gate
        self.plugins = plugins
        self.executors = dict(executors)
        self._tasks: set[asyncio.Task[None]] = set()
        self._progress: dict[str, Progress] = {}  # running action id -> its phases' progress
        self._running: dict[str, ActionRecord] = {}  # action key -> the running record
        self._after: dict[str, dict[int, list[Dependency]]] = {}  # running action id -> its dependencies
        self._plans: dict[str, Plan] = {}  # unfinished plans by id
        self._observers: list[tuple[Observer, frozenset[str] | None]] = []
        self._observers_of: dict[str, tuple[Observer, ...]] = {}  # what -> its observers (cache)
        self.counters: dict[str, int] = {
            "events": 0,
            "duplicates": 0,
            "rule_errors": 0,
            "actions_started": 0,
            "actions_suppressed": 0,
            "actions_awaiting_approval": 0,
            "hook_errors": 0,
            "plans": 0,
        }
        self.clock = gate.clock
        self.awaiting: dict[str, ActionRecord] = {}  # action id -> held for a human's approval
        self.last_event_at = 0.0  # wall clock of the last event recorded (0: none since start)
        self.started_at = time.time()  # wall clock it started: silence is counted from here until an event
        self._decisions = asyncio.Lock()  # one decision at a time (see the module docstring)

    async def load(self) -> None:
        """Read the engine's memory from the ledger: what the gate counts (unfinished and recent
        actions), the actions held for approval, the cluster history. Before the first decision."""
        ledger, gate = self.ledger, self.gate
        gate.restore(await ledger.unfinished())
        recent = await ledger.recent(self.clock() - max(gate.cooldown_s, self.AWAITING_LOOKBACK_S))
        gate.restore(r for r in recent if r.state != ActionState.AWAITING_APPROVAL)
        self.awaiting.update((r.id, r) for r in recent if r.state == ActionState.AWAITING_APPROVAL)
        gate.restore(self.awaiting.values())
        for record in recent:  # ftd's restarts of jobs: an incident of a job ends at its restart
            requeued_at = record.detail.get("requeued_at") or record.detail.get("restarted_at")
            if record.request.targets_job and isinstance(requeued_at, int | float):
                self.state.note_restart(record.request.target, float(requeued_at))
        for record in [*await ledger.unfinished(), *recent]:  # checkpoints a resume crashed on (#34)
            quarantined = record.detail.get("quarantined")
            if record.request.targets_job and isinstance(quarantined, dict):
                for step, why in quarantined.items():
                    if str(step).isdecimal():
                        self.state.checkpoints.quarantine(record.request.target, int(step), str(why))
        for event in reversed(await ledger.events(limit=self.HISTORY_EVENTS)):
            if event.node != NOTICE_NODE:  # the coordinator's notes about itself: not a node's past
                self.state.apply_event(event)

    AWAITING_LOOKBACK_S = 7 * 86400.0  # held actions older than this are not restored after a restart
    HISTORY_EVENTS = 20_000  # recent events replayed into the cluster history at start-up

    @property
    def in_progress(self) -> int:
        """Actions started and not ended yet (from memory: the health check asks no database)."""
        return len(self._progress)

    def active(self) -> list[ActionRecord]:
        """The actions running now and those held for approval (from memory, for metrics)."""
        return [*self._running.values(), *self.awaiting.values()]

    def observe(self, observer: Observer, whats: Iterable[str] | None = None) -> None:
        """Call ``observer(what, payload)`` on each notification, or only on those named in ``whats``
        ("event", "decision", "action", "rule_error"): an observer of actions costs the storm's hot
        path nothing (two notifications per event, each a call per observer, an async one a
        coroutine)."""
        self._observers.append((observer, None if whats is None else frozenset(whats)))
        self._observers_of.clear()

    async def _notify(self, what: str, payload: Any) -> None:
        observers = self._observers_of.get(what)
        if observers is None:
            observers = self._observers_of[what] = tuple(
                o for o, whats in self._observers if whats is None or what in whats
            )
        for observer in observers:
            try:
                result = observer(what, payload)
                if result is not None and inspect.isawaitable(result):  # most observers return None
                    await result
            except Exception:
                log.exception("observer_failed", what=what)

    # --- events ------------------------------------------------------------------------------

    async def handle_event(self, event: Event) -> list[ActionRecord]:
        """Decide on one event; returns the action records created (running ones continue as tasks)."""
        async with self._decisions:
            return await self._handle_event(event)

    async def handle_events(self, events: Sequence[Event]) -> None:
        """Decide on several events (a chunk of a batch) with their records in one ledger transaction:
        one commit, the storm's hot path. The decision lock is taken before the transaction, as
        everywhere (taken the other way round, a decision waiting on the ledger would deadlock)."""
        async with self._decisions, self.ledger.transaction():
            for event in events:
                await self._handle_event(event)

    async def _handle_event(self, event: Event) -> list[ActionRecord]:
        received = time.perf_counter()
        if not await self.ledger.record_event(event):
            self.counters["duplicates"] += 1
            return []
        self.counters["events"] += 1
        self.last_event_at = time.time()
        await self._notify("event", event)
        result = evaluate(self.plugins, event, self.state, self.rule_settings, slow_s=self.slow_rule_s)
        self.state.apply_event(event)
        for rule, error in result.errors:
            self.counters["rule_errors"] += 1
            log.error("rule_failed", rule=rule, event_id=event.id, error=error)
            await self._notify("rule_error", (event, rule, error))
        for rule, seconds in result.slow:
            log.warning("slow_rule", rule=rule, seconds=round(seconds, 4), event_id=event.id)
        requests = result.requests
        if requests and drill.is_drill(event):  # a drill's actions say so wherever they show
            requests = [drill.marked(r) for r in requests]
        records = await self._submit_all(requests, event_id=event.id) if requests else []
        await self._notify("decision", time.perf_counter() - received)
        return records

    # --- actions -----------------------------------------------------------------------------

    async def submit(self, request: ActionRequest) -> ActionRecord:
        """Gate, record and (if allowed) start one action. Also the entry point for manual actions."""
        async with self._decisions:
            record = await self._decide(request)
            if record.state == ActionState.PENDING:
                self._start(record)
            return record

    async def _submit_all(self, requests: list[ActionRequest], event_id: str | None) -> list[ActionRecord]:
        """Gate and record the actions asked for on one event, then start them as one plan (see the
        module docstring); one request, or requests whose order does not matter, start at once. The
        caller holds ``self._decisions``."""
        async with self.ledger.transaction():
            records = [await self._decide(request, admit=True) for request in requests]
            live = [r for r in records if r.state in (ActionState.PENDING, ActionState.AWAITING_APPROVAL)]
            duplicates = [
                self._running[r.request.key]
                for r in records
                if r.state == ActionState.SUPPRESSED
                and plans.role_of(r.request.kind) == "job"
                and r.request.key in self._running
            ]
            plan = plans.build(
                new_id("plan"), event_id, live, running_jobs=duplicates, phases=self._node_phases
            )
            if len(live) + len(duplicates) < 2 or not plans.worth_a_plan(plan):
                plan_steps: dict[str, plans.Step] = {}
            else:
                self.counters["plans"] += 1
                self._plans[plan.id] = plan
                plan_steps = {step.action: step for step in plan.steps}
                for record in live:
                    record.detail["plan"] = plan.id
                    await self.ledger.save_action(record)
                await self.ledger.save_plan(plan)
                log.info(
                    "plan_decided",
                    plan_id=plan.id,
                    event_id=event_id,
                    steps=[f"{s.kind}:{s.target}" for s in plan.steps],
                )
        if plan_steps:
            # A job action already running (this event's was a duplicate) requeues only after this
            # event's node actions too, if its requeue has not begun.
            node_deps = [
                Dependency(s.action, self._node_phases(s.kind)[1]) for s in plan.steps if s.role == "node"
            ]
            for running in duplicates:
                after = self._after.get(running.id)
                if after is not None and node_deps:
                    after.setdefault(1, []).extend(node_deps)
        for record in records:
            if record.state == ActionState.PENDING:
                step = plan_steps.get(record.id)
                self._launch(record, step.after if step else {})
        return records

    def _node_phases(self, kind: str) -> tuple[int, int]:
        return plans.node_phases(self.executors.get(kind))

    async def _decide(self, request: ActionRequest, admit: bool = False) -> ActionRecord:
        """Gate and record one action (not started: :meth:`_start`, or with ``admit`` counted as
        started for the gate already, so the next request of the same event is deduped against it,
        and launched by the caller)."""
        request = save_path.guard(request, self.state, self.clock())  # never a save onto a broken fs
        if request.kind not in self.executors:
            notification = fallback.instead(request, self.executors)
            if notification is not None:  # e.g. a drain with coordinator.scheduler = "none"
                log.info("action_without_executor_notified", kind=request.kind, target=request.target)
                request = notification
        verdict = self.gate.decide(request, self.state)
        record = ActionRecord(id=new_id("act"), request=request, state=verdict.state)
        if verdict.reason:
            record.detail["policy"] = verdict.reason
        if (verdict.allowed or verdict.state == ActionState.AWAITING_APPROVAL) and (
            request.kind not in self.executors
        ):
            record.state = ActionState.FAILED
            record.detail["error"] = fallback.no_executor_error(request)
        await self.ledger.save_action(record)
        log.info(
            "action_decided",
            action_id=record.id,
            kind=request.kind,
            target=request.target,
            state=str(record.state),
            rule=request.rule,
            reason=request.reason,
            policy=verdict.reason or None,
        )
        await self._notify("action", record)
        if record.state == ActionState.PENDING:
            if admit:
                self._admit(record)
        elif record.state == ActionState.SUPPRESSED:
            self.counters["actions_suppressed"] += 1
        elif record.state == ActionState.AWAITING_APPROVAL:
            self.counters["actions_awaiting_approval"] += 1
            self.gate.hold(record)
            self.awaiting[record.id] = record
        return record

    async def approve(self, action_id: str, by: str = "") -> ActionRecord:
        """Start an action awaiting approval (if the gate still allows it). KeyError if not held."""
        async with self._decisions:
            return await self._approve(action_id, by)

    async def _approve(self, action_id: str, by: str) -> ActionRecord:
        record = self.awaiting.pop(action_id, None)
        if record is None:
            raise KeyError(f"no action {action_id!r} is awaiting approval")
        verdict = self.gate.decide(record.request, self.state, approving=record.id)
        record.detail["approved_by"] = by or "operator"
        record.detail["approved_at"] = self.clock()
        if verdict.allowed:
            record.state = ActionState.PENDING
            record.detail.pop("policy", None)
        else:
            self.gate.release(record)
            record.state = verdict.state
            record.detail["policy"] = f"approved, then {verdict.reason}"
            if record.state == ActionState.SUPPRESSED:
                self.counters["actions_suppressed"] += 1
        await self.ledger.save_action(record)
        log.info("action_approved", action_id=record.id, state=str(record.state), by=by or None)
        await self._notify("action", record)
        if record.state == ActionState.PENDING:
            self._admit(record)
            self._launch(record, self._plan_after(record))
        return record

    async def reject(self, action_id: str, reason: str = "", by: str = "") -> ActionRecord:
        """Close an action awaiting approval as suppressed, with the operator's reason."""
        async with self._decisions:
            return await self._reject(action_id, reason, by)

    async def _reject(self, action_id: str, reason: str, by: str) -> ActionRecord:
        record = self.awaiting.pop(action_id, None)
        if record is None:
            raise KeyError(f"no action {action_id!r} is awaiting approval")
        record.state = ActionState.SUPPRESSED
        record.detail["policy"] = f"rejected by {by or 'operator'}: {reason or 'no reason given'}"
        record.detail["rejected_by"] = by or "operator"
        record.detail["rejected_at"] = self.clock()
        self.gate.finished(record)
        self.counters["actions_suppressed"] += 1
        await self.ledger.save_action(record)
        log.info("action_rejected", action_id=record.id, reason=reason, by=by or None)
        await self._notify("action", record)
        await self._finish_plan(record)
        return record

    def startup(self, coordinator: Any) -> None:
        """Call every ``ftd_startup`` implementation on its own (failures logged, start-up goes on)."""
        for plugin, error in call_each(self.plugins, "ftd_startup", coordinator=coordinator):
            self.counters["hook_errors"] += 1
            log.error("startup_hook_failed", plugin=plugin, error=error)

    def _start(self, record: ActionRecord, after: dict[int, list[Dependency]] | None = None) -> None:
        self._admit(record)
        self._launch(record, after or {})

    def _admit(self, record: ActionRecord) -> None:
        """Count ``record`` as started (gate, progress for its dependents); :meth:`_launch` runs it."""
        self.gate.started(record)
        self.counters["actions_started"] += 1
        phases = plans.phases_of(self.executors.get(record.request.kind))
        self._progress[record.id] = Progress(len(phases) if phases else 1)
        self._running[record.request.key] = record

    def _launch(self, record: ActionRecord, after: dict[int, list[Dependency]]) -> None:
        after = {phase: list(deps) for phase, deps in after.items()}
        self._after[record.id] = after  # a later event may add to it (a duplicate job action)
        task = asyncio.create_task(self._run(record, after), name=f"action:{record.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _plan_after(self, record: ActionRecord) -> dict[int, list[Dependency]]:
        """The dependencies of ``record`` in its (unfinished) plan; none outside a plan."""
        plan = self._plans.get(str(record.detail.get("plan", "")))
        step = plan.step(record.id) if plan else None
        return step.after if step else {}

    async def _wait_for(self, record: ActionRecord, deps: list[Dependency]) -> None:
        """Wait until every dependency's phase is over; one that is not running is over already."""
        waiting = [(d, self._progress[d.action]) for d in deps if d.action in self._progress]
        if not waiting:
            return
        log.info(
            "plan_step_waiting",
            action_id=record.id,
            kind=record.request.kind,
            waits_for=[f"{d.action}#{d.phase}" for d, _ in waiting],
        )
        for dep, progress in waiting:
            await progress.wait(dep.phase)

    async def _run(self, record: ActionRecord, after: dict[int, list[Dependency]]) -> None:
        executor = self.executors[record.request.kind]
        phases: tuple[str | None, ...] = plans.phases_of(executor) or (None,)
        progress = self._progress.get(record.id) or Progress(len(phases))
        done: list[str] = list(record.detail.get("phases_done", []))
        outcome: str | None = record.detail.get("phase_state")
        try:
            for index, phase in enumerate(phases):
                if after.get(index):
                    await self._wait_for(record, after[index])
                if phase is not None and phase not in done:
                    record.detail["phase"] = phase  # the phase under way (ftd actions list)
                if record.state != ActionState.RUNNING:
                    record.state = ActionState.RUNNING
                    await self.ledger.save_action(record)
                    await self._notify("action", record)
                if phase is not None and phase in done:
                    progress.reached(index)  # done before a restart
                    continue
                if phase is None:  # a plain executor: its own word on how it went
                    detail = dict(await executor(record))
                    outcome = detail.pop("state", None)
                else:
                    assert isinstance(executor, plans.PhasedExecutor)
                    detail = dict(await executor.run_phase(record, phase))
                    outcome = plans.merge_state(outcome, detail.pop("state", None))
                record.detail.update(detail)
                if phase is not None:
                    done.append(phase)
                    record.detail["phases_done"] = list(done)
                    if outcome is not None:
                        record.detail["phase_state"] = outcome
                    if index < len(phases) - 1:
                        record.detail["phase"] = phases[index + 1]
                        await self.ledger.save_action(record)  # a resumed action skips what is done
                        await self._notify("action", record)
                progress.reached(index)
            record.detail.pop("phase_state", None)
            record.state = ActionState(outcome or ActionState.SUCCEEDED)
        except asyncio.CancelledError:
            raise  # shutting down: the record stays 'running' and is resumed on the next start
        except Exception as exc:
            record.state = ActionState.FAILED
            record.detail["error"] = f"{type(exc).__name__}: {exc}"
            log.error(
                "action_failed",
                action_id=record.id,
                kind=record.request.kind,
                target=record.request.target,
                error=record.detail["error"],
            )
        finally:
            progress.finish()  # dependents go on whatever happened (order, not success)
            self._progress.pop(record.id, None)
            self._after.pop(record.id, None)
            if self._running.get(record.request.key) is record:
                del self._running[record.request.key]
        self.gate.finished(record)
        await self.ledger.save_action(record)
        await self._finish_plan(record)
        log.info(
            "action_finished",
            action_id=record.id,
            kind=record.request.kind,
            target=record.request.target,
            state=str(record.state),
        )
        await self._notify("action", record)
        for plugin, error in call_each(
            self.plugins, "ftd_action_completed", request=record.request, record=record
        ):
            self.counters["hook_errors"] += 1
            log.error("action_completed_hook_failed", plugin=plugin, action_id=record.id, error=error)

    async def _finish_plan(self, record: ActionRecord) -> None:
        """Mark the plan of ``record`` finished once none of its steps runs any more."""
        plan = self._plans.get(str(record.detail.get("plan", "")))
        if plan is None or not self._plan_over(plan):
            return
        plan.state = "finished"
        del self._plans[plan.id]
        await self.ledger.save_plan(plan)
        log.info("plan_finished", plan_id=plan.id)

    def _plan_over(self, plan: Plan) -> bool:
        """No step of ``plan`` runs, waits to run, or waits for a human."""
        return not any(step.action in self._progress or step.action in self.awaiting for step in plan.steps)

    async def resume_unfinished(self) -> list[ActionRecord]:
        """Restart actions a previous run left pending or running (executors are idempotent), in
        the order of their plans: each one waits again for the steps it depends on that are being
        resumed too, and skips the phases it had finished (``detail["phases_done"]``)."""
        async with self._decisions:
            return await self._resume_unfinished()

    async def _resume_unfinished(self) -> list[ActionRecord]:
        # What this run decided itself (bus messages are handled a moment before the resume) is
        # running already: resuming it too would run it twice.
        mine = set(self._progress) | set(self.awaiting) | {r.id for r in self._running.values()}
        resumed = [record for record in await self.ledger.unfinished() if record.id not in mine]
        for plan in await self.ledger.plans(limit=10_000, unfinished=True):
            self._plans.setdefault(plan.id, plan)
        startable: list[ActionRecord] = []
        for record in resumed:
            if record.request.kind not in self.executors:
                record.state = ActionState.FAILED
                record.detail["error"] = fallback.no_executor_error(record.request)
                await self.ledger.save_action(record)
                continue
            log.info(
                "action_resuming",
                action_id=record.id,
                kind=record.request.kind,
                target=record.request.target,
                plan_id=record.detail.get("plan"),
                phases_done=record.detail.get("phases_done"),
            )
            record.detail["resumed"] = record.detail.get("resumed", 0) + 1
            self._admit(record)  # every resumed step first: dependents see what still runs
            startable.append(record)
        for record in startable:
            self._launch(record, self._plan_after(record))
        for plan in list(self._plans.values()):  # plans whose every step had finished already
            if self._plan_over(plan):
                plan.state = "finished"
                del self._plans[plan.id]
                await self.ledger.save_plan(plan)
        return resumed

    async def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no action is running; False on timeout."""
        if not self._tasks:
            return True
        _, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
        return not pending

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
