"""A GPU past NVIDIA's SRAM replacement threshold is a node condition and a preflight failure (issue #31
item 10).

NVIDIA's guidance: a GPU with more than 4 uncorrectable SRAM errors over its life (NVML's aggregate
uncorrectable counter at the SRAM location, or the driver's own ``bThresholdExceeded`` of
``nvmlDeviceGetSramEccErrorStatus``) is to be replaced. A GPU already past it when the agent started
was never flagged: the NVML watcher's first sample is a baseline whose counters are not reported, and
preflight did not look. Now the watcher raises a critical ``ecc`` event (``signal = "sram_threshold"``)
on the first sample and whenever the threshold is crossed, which opens a condition (``ftd health``)
and reaches the ``ecc_remap`` rule (save, move the job, drain for RMA), and preflight's ``ecc_remap``
check fails on it. All against the fake NVML.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ftd.agent.conditions import ConditionBook
from ftd.agent.preflight.runner import run_preflight
from ftd.agent.watchers.nvml.fake import FakeNvml
from ftd.agent.watchers.nvml.watcher import NvmlWatcher
from ftd.config import AgentConfig, NvmlConfig
from ftd.config.schema import PreflightConfig
from ftd.events import Event, Kind, Severity, make_event
from ftd.rules import ecc_remap
from ftd.testing import evaluate_rule, view_with

pytestmark = pytest.mark.timeout(60)

NODE = "node-a"


class Watch:
    def __init__(self, fake: FakeNvml) -> None:
        self.fake = fake
        self.events: list[Event] = []
        self.watcher = NvmlWatcher(NvmlConfig(call_timeout_s=5.0), NODE, self.emit, backend=fake)
        fake.init()
        self.watcher.available = True

    async def emit(self, event: Event) -> None:
        self.events.append(event)

    async def poll(self) -> list[Event]:
        before = len(self.events)
        await self.watcher.poll_once()
        return [e for e in self.events[before:] if e.data.get("signal") == "sram_threshold"]


async def test_a_gpu_already_past_the_threshold_at_start_is_flagged_once() -> None:
    fake = FakeNvml(2)
    fake.gpu(1).ecc["aggregate_dbe_sram"] = 5  # five over its life, none since the last boot
    w = Watch(fake)
    (flag,) = await w.poll()
    assert (flag.kind, flag.severity) == (Kind.ECC, Severity.CRITICAL)
    assert flag.data["initial"] is True
    assert (flag.data["sram_uncorrectable"], flag.data["threshold"]) == (5, 4)
    assert flag.data["pci"] == fake.gpu(1).pci and flag.data["uuid"] == fake.gpu(1).uuid
    assert await w.poll() == []  # still past it: said once
    assert [e for e in w.events if e.data.get("signal") == "sram_threshold"] == [flag]


async def test_crossing_it_later_is_flagged_when_it_happens() -> None:
    fake = FakeNvml(1)
    gpu = fake.gpu(0)
    gpu.ecc["aggregate_dbe_sram"] = 4  # at the threshold is not past it
    w = Watch(fake)
    assert await w.poll() == []
    gpu.bump_ecc("dbe", 1, location="sram")
    (flag,) = await w.poll()
    assert flag.data["initial"] is False and flag.data["sram_uncorrectable"] == 5
    gpu.bump_ecc("dbe", 1, location="sram")
    assert await w.poll() == []


async def test_the_drivers_own_threshold_flag_counts_too() -> None:
    fake = FakeNvml(1)
    w = Watch(fake)
    assert await w.poll() == []
    fake.gpu(0).sram_threshold_exceeded = True
    (flag,) = await w.poll()
    assert flag.data["threshold_exceeded"] is True and flag.severity is Severity.CRITICAL
    ecc_events = [e for e in w.events if e.kind is Kind.ECC]
    assert ecc_events == [flag]  # the flag is not a counter that "rose"
    actions = evaluate_rule(ecc_remap, flag, view_with(jobs={"j1": [NODE]}))
    assert [str(a.kind) for a in actions] == ["checkpoint_restart", "drain_node"]
    assert "SRAM error threshold exceeded (the driver's flag)" in actions[1].reason


async def test_the_flag_is_a_condition_and_the_rule_moves_the_job_and_drains(tmp_path: Path) -> None:
    fake = FakeNvml(1)
    fake.gpu(0).ecc["aggregate_dbe_sram"] = 7
    (flag,) = await Watch(fake).poll()
    book = ConditionBook(tmp_path / "conditions.json", boot="b1")
    assert book.observe(flag)
    (cond,) = book.active()
    assert cond.kind == "ecc" and cond.subject == fake.gpu(0).pci
    assert "sram_threshold" in cond.reason
    # a GPU reset that went well ends the GPU's other conditions, not this one: the count is lifetime
    xid = make_event(NODE, Kind.XID, severity="critical", data={"code": 48, "pci": fake.gpu(0).pci})
    assert book.observe(xid)
    healthy = make_event(
        NODE, Kind.GPU_HEALTH, severity="info", data={"result": "healthy", "pci": fake.gpu(0).pci}
    )
    assert book.observe(healthy)
    assert [c.key for c in book.active()] == [cond.key]
    assert ConditionBook(tmp_path / "conditions.json", boot="b1").active()[0].signal == "sram_threshold"
    actions = evaluate_rule(ecc_remap, flag, view_with(jobs={"j1": [NODE, "node-b"]}))
    assert [(str(a.kind), a.target) for a in actions] == [("checkpoint_restart", "j1"), ("drain_node", NODE)]
    assert actions[0].params["exclude"] == [NODE]
    assert "7 uncorrectable SRAM errors (> 4)" in actions[1].reason


def preflight_config(tmp_path: Path) -> AgentConfig:
    return AgentConfig(
        state_dir=str(tmp_path),
        nvml=NvmlConfig(expected_gpus=2),
        preflight=PreflightConfig(gpu_compute=False, dcgm=False, nccl=False),
    )


def test_preflight_fails_a_gpu_past_the_threshold(tmp_path: Path) -> None:
    fake = FakeNvml(2)
    fake.gpu(1).ecc["aggregate_dbe_sram"] = 5
    report = run_preflight(preflight_config(tmp_path), fake)
    assert not report.ok
    assert report.reason == (
        "ecc_remap: GPU 1 (0000:28:00.0): 5 uncorrectable SRAM errors over its life "
        "(more than 4: replace the GPU)"
    )
    fake.gpu(1).ecc["aggregate_dbe_sram"] = 4
    assert run_preflight(preflight_config(tmp_path), fake).ok
    fake.gpu(0).sram_threshold_exceeded = True
    report = run_preflight(preflight_config(tmp_path), fake)
    assert report.reason == (
        "ecc_remap: GPU 0 (0000:18:00.0): the driver reports the SRAM error threshold exceeded "
        "(replace the GPU)"
    )


def test_the_real_backend_reads_the_newer_sram_status_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """RealNvml's use of ``nvmlDeviceGetSramEccErrorStatus`` through pynvml's own structure, with only
    the C call replaced (no GPU here): the sum, the flag, and a driver without the call."""
    import pynvml  # type: ignore[import-untyped]  # nvidia-ml-py: installed with the daemon

    from ftd.agent.watchers.nvml.real import RealNvml

    seen: list[int] = []

    def answer(handle: object, status: object) -> int:
        struct = status._obj  # type: ignore[attr-defined]  # what ctypes.byref points at
        seen.append(struct.version)
        struct.aggregateUncParity, struct.aggregateUncSecDed, struct.bThresholdExceeded = 2, 4, 1
        return 0

    backend = RealNvml()
    backend._nv = pynvml
    monkeypatch.setattr(pynvml, "nvmlDeviceGetSramEccErrorStatus", answer)
    out = {"aggregate_dbe_sram": 3}
    backend._sram_status(object(), out)
    assert seen == [pynvml.nvmlEccSramErrorStatus_v1]
    assert out == {"aggregate_dbe_sram": 6, "sram_threshold_exceeded": 1}

    def missing(handle: object, status: object) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetSramEccErrorStatus", missing)
    kept = {"aggregate_dbe_sram": 3}
    backend._sram_status(object(), kept)
    assert kept == {"aggregate_dbe_sram": 3}
