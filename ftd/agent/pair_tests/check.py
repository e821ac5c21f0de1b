"""A pair test as a node check: the burn-in's ``pair`` step and preflight's ``pair_test`` check.

What: :func:`pair_check` runs one pair test against a known-good peer (``{"node", "host", "port"}``:
the coordinator names one, or ``ftd preflight --pair-peer``) through the node's
:class:`~ftd.agent.pair_tests.service.PairTestService` (its key, caps and busy check) and judges it
like every pair test (:func:`ftd.fabric.pairs.judge_pair`: the node's hardware profile's ``pair``
section and, when given, the fleet's baselines: bandwidth and round trip) into a
:class:`~ftd.platform.burn_in.StepResult`: ``pass``, ``fail`` (slow, or the test did not complete:
never a pass) or ``skip`` (nothing to judge against), with the reasons and the result's figures.

Why one function: the burn-in and preflight must judge a pair the same way.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ftd.agent.pair_tests.service import PairTestService
from ftd.catalog.hardware_profiles import HardwareCatalogError, load_hardware_catalog
from ftd.fabric.pairs import expectation, judge_pair
from ftd.platform.burn_in import StepResult

__all__ = ["pair_check"]


async def pair_check(
    service: PairTestService,
    peer: Mapping[str, Any],
    profile: str | None,
    baseline_gbps: float | None = None,
    *,
    name: str = "pair",
    catalog: str = "",
    rtt_baseline_ms: float | None = None,
) -> StepResult:
    started = time.monotonic()
    cfg = service.cfg
    result = await service.test(
        peer.get("node"), peer.get("host"), peer.get("port"), cfg.max_bytes, cfg.timeout_s
    )
    try:
        loaded = load_hardware_catalog(Path(catalog) if catalog else None)  # an operator's, when named
        section = loaded.section("pair", profile) if profile else None
    except HardwareCatalogError:
        section = None
    verdict = judge_pair(
        result, expectation(section), baseline_gbps, profile=profile, rtt_baseline_ms=rtt_baseline_ms
    )
    status = {"pass": "pass", "skipped": "skip"}.get(verdict.status, "fail")
    why = "; ".join(verdict.reasons) or f"pair test with {peer.get('node')} passed"
    figures = {**result.as_dict(), "peer": peer.get("node"), "verdict": verdict.status}
    return StepResult(name, status, why, figures, seconds=round(time.monotonic() - started, 3))  # type: ignore[arg-type]
