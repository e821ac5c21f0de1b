"""Reconciliation as a property: whatever the scheduler and the ledger said before, one round makes
ftd's picture equal the scheduler's, and a second round with nothing changed changes nothing.

Hypothesis draws, for four nodes, what the ledger recorded (nothing, ftd's drain, someone else's)
and a sequence of scheduler states (drained or not, down or not, the reason: none, ftd's, an
operator's); after each round the invariants of :mod:`ftd.coordinator.upkeep.reconcile` must hold.
"""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from ftd.coordinator.actions.scheduler import FakeScheduler
from ftd.coordinator.decide.engine import Engine
from ftd.coordinator.decide.plugins import make_plugin_manager
from ftd.coordinator.decide.policy import PolicyGate
from ftd.coordinator.ledger.sqlite import Ledger, SqliteStore
from ftd.coordinator.ledger.store import Drain
from ftd.coordinator.model.state import ClusterState
from ftd.coordinator.upkeep.reconcile import Reconciler
from tests.properties import examples

NODES = ("node-1", "node-2", "node-3", "node-4")

recorded = st.sampled_from([None, "ftd", "external"])
node_state = st.tuples(
    st.booleans(),  # drained
    st.booleans(),  # down
    st.sampled_from([None, "ftd: xid 79", "maintenance", "ftd:x"]),  # reason
)
cluster_state = st.fixed_dictionaries({node: node_state for node in NODES})


def apply(sched: FakeScheduler, states: dict[str, tuple[bool, bool, str | None]]) -> None:
    for node, (drained, down, reason) in states.items():
        n = sched.nodes[node]
        n.state = "DOWN" if down else "IDLE"
        n.drained = drained
        n.reason = reason if (drained or down) else None


@settings(max_examples=examples(150), deadline=None)
@given(
    st.fixed_dictionaries({node: recorded for node in NODES}),
    st.lists(cluster_state, min_size=1, max_size=4),
)
def test_one_round_makes_ftd_agree_with_the_scheduler(
    before: dict[str, str | None], rounds: list[dict[str, tuple[bool, bool, str | None]]]
) -> None:
    sched = FakeScheduler()
    for node in NODES:
        sched.add_node(node)
    ledger = Ledger(":memory:")
    store = SqliteStore(ledger)
    for node, origin in before.items():
        if origin is not None:
            ledger.save_drain(Drain(node, origin, "ftd: old" if origin == "ftd" else "old", 1.0))
    state = ClusterState()

    async def rounds_of() -> None:
        engine = Engine(
            state=state,
            ledger=store,
            gate=PolicyGate(),
            plugins=make_plugin_manager(builtins=False, entry_points=False),
            executors={},
        )
        reconciler = Reconciler(state=state, ledger=store, scheduler=sched, engine=engine)
        await engine.load()
        await reconciler.restore()
        assert set(state.drained_nodes()) == {n for n, o in before.items() if o == "ftd"}
        clock = 10.0
        for states in rounds:
            apply(sched, states)
            clock += 1.0
            reconciler.clock = lambda c=clock: c
            await reconciler.reconcile()
            rows = {d.node: d for d in ledger.drains()}
            for node, (drained, down, reason) in states.items():
                out = drained or down
                ours = out and (reason or "").startswith("ftd:")
                assert (node in state.drained_nodes()) == ours, (node, states)
                assert (node in state.unavailable) == (out and not ours), (node, states)
                if not out:
                    assert node not in rows
                else:
                    assert rows[node].origin == ("ftd" if ours else "external")
            events = len(ledger.events(limit=10_000))
            assert await reconciler.reconcile() == {}  # nothing changed: nothing to do
            assert len(ledger.events(limit=10_000)) == events

    asyncio.run(rounds_of())
    ledger.close()
