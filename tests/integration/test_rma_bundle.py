"""The repair bundle collected end to end on one node (issue #36 item 5).

The agent's ``rma_bundle`` directive handler runs the real collector: ``nvidia-bug-report.sh`` is a
real process (a script of this test's, on the collector's path), the kernel log a file of records in
``/dev/kmsg``'s format, NVML the project's fake (one GPU lost: its error is kept in place), ftd's
state files the agent's own. Out: a tar.gz under ``state_dir/rma`` with a manifest whose hashes match,
an ``rma_bundle`` event with its path, and an Ack carrying it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import tarfile
from functools import partial
from pathlib import Path
from typing import Any

from ftd.agent.diagnostics import _run
from ftd.agent.node_actions import NodeActions
from ftd.agent.rma.bundle import collect_bundle, kmsg_window
from ftd.agent.watchers.nvml.fake import FakeNvml
from ftd.events import Ack, Directive, Event, Kind, decode

NOW_US = 5_000_000_000  # the kernel clock "now" of the kmsg file below (5000 s after boot)


class _Outbox:
    def __init__(self) -> None:
        self.acks: list[Ack] = []

    def put(self, item: Any) -> None:
        self.acks.append(decode(item.payload, Ack))


def _kmsg(path: Path) -> None:
    path.write_text(
        "6,100,1000000000,-;old: outside the window\n"
        "3,200,4990000000,-;NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus.\n"
        " SUBSYSTEM=pci\n"
        "4,201,4995000000,-;mlx5_core 0000:5e:00.0: mlx5_cmd_out_err: ACCESS_REG timeout\n"
    )


def _bug_report_tool(tmp: Path) -> str:
    tool = tmp / "nvidia-bug-report.sh"
    tool.write_text(
        f"#!{sys.executable}\nimport gzip, sys\n"
        "out = sys.argv[sys.argv.index('--output-file') + 1]\n"
        "with gzip.open(out + '.gz', 'wt') as f:\n"
        "    f.write('nvidia-bug-report of this test\\n')\n"
    )
    tool.chmod(0o755)
    return str(tool)


def test_a_node_drained_for_repair_gets_its_bundle(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "burn-in").mkdir(parents=True)
    (state / "conditions.json").write_text('{"xid:0000:18:00.0": {"kind": "xid"}}')
    (state / "burn-in" / "latest.json").write_text('{"verdict": "failed"}')
    kmsg = tmp_path / "kmsg"
    _kmsg(kmsg)
    nvml = FakeNvml(2)
    nvml.gpu(1).lost = True
    events: list[Event] = []
    outbox = _Outbox()

    async def emit(event: Event) -> None:
        events.append(event)

    collect = partial(
        collect_bundle,
        "node-3",
        state,
        run=_run,
        kmsg_path=str(kmsg),
        kmsg_window_s=60,
        nvml=nvml,
        bug_report_tool=_bug_report_tool(tmp_path),
        now_us=NOW_US,
    )

    async def bundle_now(params: Any) -> Any:
        return await collect(evidence={"reason": params["reason"], "events": params["evidence"]["events"]})

    actions = NodeActions(
        "node-3",
        outbox=outbox,  # type: ignore[arg-type]
        emit=emit,
        gpu_resetter=None,  # type: ignore[arg-type]
        jobs=dict,
        preflight_now=None,  # type: ignore[arg-type]
        diagnostics_dir=tmp_path / "diag",
        rma_bundle_now=bundle_now,
    )
    directive = Directive(
        id="act-9-rma_bundle",
        ts=0.0,
        action="rma_bundle",
        action_id="act-9",
        params={
            "reason": "ftd: RMA: preflight failed",
            "evidence": {"events": [{"kind": "xid", "code": 79}]},
        },
    )
    handler = actions.handler("rma_bundle")
    assert handler is not None
    asyncio.run(handler(directive))

    [event] = events
    assert event.kind is Kind.RMA_BUNDLE and event.data["action_id"] == "act-9"
    path = Path(event.data["path"])
    assert (
        path.parent == state / "rma" and path.name.startswith("node-3-") and path.suffixes == [".tar", ".gz"]
    )
    [ack] = outbox.acks
    assert ack.ok and ack.path == str(path) and ack.directive_id == "act-9-rma_bundle"
    with tarfile.open(path) as tar:
        names = {m.name.split("/", 1)[1]: m for m in tar.getmembers()}
        manifest = json.loads(tar.extractfile(names["manifest.json"]).read())  # type: ignore[union-attr]
        for member, facts in manifest["files"].items():
            body = tar.extractfile(names[member]).read()  # type: ignore[union-attr]
            assert hashlib.sha256(body).hexdigest() == facts["sha256"]
        kmsg_text = tar.extractfile(names["kmsg.txt"]).read().decode()  # type: ignore[union-attr]
        nvml_state = json.loads(tar.extractfile(names["nvml.json"]).read())  # type: ignore[union-attr]
        evidence = json.loads(tar.extractfile(names["ftd/evidence.json"]).read())  # type: ignore[union-attr]
    assert set(manifest["files"]) == {
        "nvidia-bug-report.log.gz",
        "kmsg.txt",
        "nvml.json",
        "ftd/conditions.json",
        "ftd/burn-in/latest.json",
        "ftd/evidence.json",
    }
    assert "fallen off the bus" in kmsg_text and " SUBSYSTEM=pci" in kmsg_text and "old:" not in kmsg_text
    assert nvml_state["count"] == 2
    assert nvml_state["gpus"][0]["identity"]["uuid"].startswith("GPU-fake-0000")
    assert "error" in nvml_state["gpus"][1]["ecc_counters"]  # the lost GPU: its error, not a value
    assert evidence["reason"] == "ftd: RMA: preflight failed" and evidence["events"][0]["code"] == 79
    # What was not there is named, with why.
    assert manifest["missing"]["ftd/jobs.json"] == "not on this node (nothing recorded)"
    # A re-delivered directive gets the same answer; no second bundle.
    asyncio.run(handler(directive))
    assert len(events) == 1 and outbox.acks[1] == ack
    assert len(list((state / "rma").glob("*.tar.gz"))) == 1


def test_missing_tools_and_sources_are_named_not_hidden(tmp_path: Path) -> None:
    bundle = asyncio.run(
        collect_bundle("n", tmp_path, run=_run, kmsg_path=str(tmp_path / "nope"), nvml=None, find_tool=False)
    )
    assert bundle.missing["nvidia-bug-report"] == "nvidia-bug-report.sh is not on PATH"
    assert "FileNotFoundError" in bundle.missing["kmsg"]
    assert bundle.missing["nvml"].startswith("no NVML backend")
    assert Path(bundle.path).exists()


def test_a_hung_bug_report_is_killed_at_its_deadline(tmp_path: Path) -> None:
    tool = tmp_path / "nvidia-bug-report.sh"
    tool.write_text("#!/bin/sh\nsleep 60\n")
    tool.chmod(0o755)
    bundle = asyncio.run(
        collect_bundle(
            "n",
            tmp_path,
            run=_run,
            kmsg_path=str(tmp_path / "k"),
            bug_report_tool=str(tool),
            bug_report_timeout_s=0.5,
        )
    )
    assert bundle.missing["nvidia-bug-report"].startswith("nvidia-bug-report.sh ran past 0.5 s")


def test_kmsg_window_reads_the_real_device_when_readable() -> None:
    text, why = kmsg_window("/dev/kmsg", 10 * 365 * 86400)
    assert why is None or "kmsg" in why  # a container without /dev/kmsg says why
    if why is None:
        assert all(line[:1].isdigit() or line.startswith(" ") for line in text.splitlines())
