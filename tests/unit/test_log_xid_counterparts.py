"""A training-log line that says what an Xid says is acted on like that Xid (issue #31 item 10).

"CUDA error: uncorrectable ECC error encountered" is what a trainer prints when its GPU hits an
uncorrectable ECC error (the kernel's Xid 48); "CUDA-capable device(s) is/are busy or unavailable" /
"no CUDA-capable device is detected" what it prints when its GPU is gone (Xid 79, fallen off the
bus). Both were matched by the log watcher and then left alone by every rule: without the kernel's
Xid line (no /dev/kmsg in a container, a watcher off) nothing saved, moved or checked anything.

The pattern table names the Xid each line stands for (``xid = 48`` / ``xid = 79`` in
``log_patterns.toml``); the ``xid_catalog`` rule decides such a line by that Xid's plan, the same
table ``ftd xid explain`` prints (:mod:`ftd.catalog.remedy`). A line names no GPU: for Xid 48's
reset, a DBE the NVML watcher reported on the node just before names it; with none, the node is
drained instead of a reset of an unknown GPU (so its GPUs are checked before it takes work again).
The line is the trainer's view of a fault the kernel's Xid may already have reported: within one
incident window after that Xid it is not acted on a second time.

Every test runs the real log watcher on a real file and asks every built-in rule, as the
coordinator does.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import pytest

from ftd.agent.watchers.logfile import LogWatcher
from ftd.catalog.log_patterns import parse_patterns
from ftd.config import LogsConfig
from ftd.coordinator.decide.plugins import evaluate, make_plugin_manager
from ftd.events import Event, Kind
from ftd.plugin import ActionRequest
from ftd.plugin.settings import RuleSettings
from ftd.testing import make_event, view_with

pytestmark = pytest.mark.timeout(60)

NODE = "node-a"
PCI = "0000:18:00.0"
ECC_LINE = "RuntimeError: CUDA error: uncorrectable ECC error encountered\n"
GONE_LINE = "RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable\n"
NO_DEVICE_LINE = "RuntimeError: No CUDA GPUs are available: no CUDA-capable device is detected\n"


async def logged(tmp_path: Path, line: str, patterns_file: str | None = None) -> Event:
    """The event the real log watcher emits for ``line`` written to a trainer's new log."""
    events: list[Event] = []

    async def emit(event: Event) -> None:
        events.append(event)

    cfg = LogsConfig(paths=[str(tmp_path / "*.log")], rescan_s=0.05, patterns_file=patterns_file)
    watcher = LogWatcher(cfg, NODE, emit, use_inotify=False)
    task = asyncio.create_task(watcher.run())
    try:
        await asyncio.sleep(0.1)
        (tmp_path / "rank0.log").write_text("step 100 loss 2.31\n" + line)
        deadline = time.monotonic() + 10
        while not events:
            assert time.monotonic() < deadline, "the watcher emitted nothing"
            await asyncio.sleep(0.02)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    (event,) = events
    return event


def decide(event: Event, history: tuple[Event, ...] = ()) -> list[ActionRequest]:
    """What every built-in rule asks for ``event`` (the coordinator's evaluation)."""
    view = view_with(jobs={"j1": [NODE, "node-b"]}, nodes=["spare-1"], history=history)
    result = evaluate(make_plugin_manager(entry_points=False), event, view, RuleSettings())
    assert result.errors == []
    return result.requests


def plan(requests: list[ActionRequest]) -> list[tuple[str, str, str]]:
    return [(str(r.kind), r.target, r.rule) for r in requests]


def xid(code: int, ts: float, **data: object) -> Event:
    return make_event(NODE, "xid", severity="critical", data={"code": code, "pci": PCI, **data}, ts=ts)


async def test_the_uncorrectable_ecc_line_moves_the_job_and_drains_a_node_whose_gpu_is_unknown(
    tmp_path: Path,
) -> None:
    event = await logged(tmp_path, ECC_LINE)
    assert (event.kind, event.data["pattern"], event.data["xid"]) == (
        Kind.LOG_PATTERN,
        "cuda_uncorrectable_ecc",
        48,
    )
    requests = decide(event)
    assert plan(requests) == [
        ("checkpoint_restart", "j1", "xid_catalog"),
        ("drain_node", NODE, "xid_catalog"),
    ]
    restart, drain = requests
    assert restart.params["exclude"] == [NODE]  # saved, then moved off the node
    assert (restart.params["code"], restart.params["bucket"]) == (48, "WORKFLOW_XID_48")
    assert "cuda_uncorrectable_ecc" in drain.reason and "xid 48" in drain.reason
    assert "the line names no GPU" in drain.reason


async def test_with_the_nvml_dbe_naming_the_gpu_it_is_xid_48s_reset(tmp_path: Path) -> None:
    event = await logged(tmp_path, ECC_LINE)
    dbe = make_event(
        NODE, "ecc", severity="error", data={"pci": PCI, "uuid": "GPU-1", "dbe": True}, ts=event.ts - 3
    )
    requests = decide(event, (dbe,))
    kernel = decide(xid(48, event.ts, uuid="GPU-1"))
    assert (
        plan(requests)
        == plan(kernel)
        == [
            ("checkpoint_restart", "j1", "xid_catalog"),
            ("gpu_reset", NODE, "xid_catalog"),
        ]
    )
    assert requests[1].params["pci"] == kernel[1].params["pci"] == PCI
    assert requests[1].params["uuid"] == "GPU-1"
    assert requests[0].params["exclude"] == kernel[0].params["exclude"] == [NODE]


@pytest.mark.parametrize("line", [GONE_LINE, NO_DEVICE_LINE])
async def test_the_device_unavailable_line_is_xid_79s_drain(tmp_path: Path, line: str) -> None:
    event = await logged(tmp_path, line)
    assert (event.data["pattern"], event.data["xid"]) == ("cuda_device_unavailable", 79)
    requests = decide(event)
    kernel = decide(make_event(NODE, "gpu_fallen_off_bus", severity="critical", data={}, ts=event.ts))
    assert (
        plan(requests)
        == plan(kernel)
        == [
            ("checkpoint_restart", "j1", "xid_catalog"),
            ("drain_node", NODE, "xid_catalog"),
        ]
    )
    assert requests[0].params["exclude"] == [NODE]
    assert (requests[1].params["code"], requests[1].params["bucket"]) == (79, "RESTART_BM")


async def test_after_the_kernels_own_xid_the_line_is_not_acted_on_twice(tmp_path: Path) -> None:
    event = await logged(tmp_path, ECC_LINE)
    assert decide(event, (xid(48, event.ts - 2),)) == []
    assert decide(event, (xid(94, event.ts - 2),)) == []  # the contained-ECC Xid of newer GPUs too
    # a long-past Xid is another incident: the line is acted on
    assert plan(decide(event, (xid(48, event.ts - 3600),)))[0][0] == "checkpoint_restart"
    other = tmp_path / "other"
    other.mkdir()
    gone = await logged(other, GONE_LINE)
    assert decide(gone, (xid(79, gone.ts - 1),)) == []
    missing = make_event(NODE, "gpu_missing", severity="critical", data={"pci": PCI}, ts=gone.ts - 4)
    assert decide(gone, (missing,)) == []  # NVML saw the GPU go first: gpu_health drained already


async def test_an_operators_table_names_the_xid_a_line_stands_for(tmp_path: Path) -> None:
    table = tmp_path / "patterns.toml"
    table.write_text(
        '[[pattern]]\nname = "site_gpu_gone"\nregex = "GPU has vanished"\nseverity = "critical"\nxid = 79\n'
    )
    logs = tmp_path / "logs"
    logs.mkdir()
    event = await logged(logs, "fatal: GPU has vanished\n", patterns_file=str(table))
    assert (event.data["pattern"], event.data["xid"]) == ("site_gpu_gone", 79)
    assert [str(r.kind) for r in decide(event)] == ["checkpoint_restart", "drain_node"]


def test_the_table_refuses_an_xid_it_does_not_know() -> None:
    for bad in ('"48"', "true", "0", "123456"):
        with pytest.raises(ValueError, match=r"pattern\[0\] \(p\): xid"):
            parse_patterns(f'[[pattern]]\nname = "p"\nregex = "x"\nxid = {bad}\n')
    (ok,) = parse_patterns('[[pattern]]\nname = "p"\nregex = "x"\nxid = 79\n')
    assert ok.xid == 79


def test_other_cuda_errors_stay_application_faults() -> None:
    line = make_event(
        NODE, "log_pattern", severity="error", data={"pattern": "cuda_illegal_memory_access"}, ts=100.0
    )
    assert [(str(r.kind), r.rule) for r in decide(line)] == [("checkpoint_restart", "app_faults")]
    assert decide(line)[0].params["exclude"] == []  # restarted in place: the node is not suspect
