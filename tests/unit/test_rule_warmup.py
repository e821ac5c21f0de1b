"""The coordinator's first Xid is decided without loading anything: the xid_catalog rule reads the
packaged catalog at start-up (``ftd_startup``), not inside the first event's evaluation, where the
~50 ms parse made every coordinator log ``slow_rule`` on its first fault."""

from __future__ import annotations

import time

from ftd.catalog import load_xid_catalog
from ftd.config import CoordinatorConfig
from ftd.coordinator.decide.plugins import call_each, evaluate
from ftd.coordinator.decide.replay import Sandbox
from ftd.coordinator.ledger.sqlite import memory_store
from ftd.events import Event


def test_startup_loads_the_xid_catalog_before_the_first_event() -> None:
    sandbox = Sandbox(CoordinatorConfig(), ledger=memory_store, entry_points=False)
    load_xid_catalog.cache_clear()
    assert call_each(sandbox.engine.plugins, "ftd_startup", coordinator=sandbox.host) == []
    assert load_xid_catalog.cache_info().currsize == 1
    before = load_xid_catalog.cache_info().misses
    event = Event(
        id="e1",
        ts=time.time(),
        node="n1",
        kind="xid",
        severity="critical",
        source="kmsg",
        data={"code": 79, "pci": "0000:3b:00.0"},
    )
    result = evaluate(sandbox.engine.plugins, event, sandbox.state, sandbox.engine.rule_settings)
    assert [r.kind for r in result.requests if r.rule == "xid_catalog"]  # it decided...
    assert load_xid_catalog.cache_info().misses == before  # ...from the catalog read at start-up
