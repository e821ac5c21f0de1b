"""A rank's checkpoint report, verified by the agent before it counts (issue #34): real files, a real
LocalApi on a real unix socket, raw protocol lines."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest

from ftd.agent.checkpoints import CheckpointReport, verify_report
from ftd.agent.local_api import LocalApi
from ftd.client import manifest as mf
from ftd.events import Event, Kind, Severity
from tests.unit.helpers import Recorder, until
from tests.unit.test_local_api import Peer


@pytest.fixture
def ckdir() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="ftd-ck-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def write_checkpoint(
    root: str, step: int, rank: int, *, payload: bytes = b"w" * 4096, level: str = "local"
) -> str:
    """One rank's shard and its manifest, as the tier lays them out; returns the manifest path."""
    step_dir = os.path.join(root, f"step-{step:09d}")
    os.makedirs(os.path.join(step_dir, f"rank-{rank:05d}"), exist_ok=True)
    rel = f"rank-{rank:05d}/state.pt"
    with open(os.path.join(step_dir, rel), "wb") as f:
        f.write(payload)
    manifest = mf.Manifest(
        job="j1",
        step=step,
        rank=rank,
        world_size=2,
        generation=0,
        level=level,
        created=time.time(),
        save_s=0.5,
        files=(mf.file_entry(step_dir, rel),),
    )
    return mf.write(step_dir, manifest)


def flip_byte(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def write_bytes(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def report(path: str, step: int = 100, *, uid: int | None = None, level: str = "local") -> CheckpointReport:
    return CheckpointReport(
        node="n1",
        job="j1",
        rank=1,
        step=step,
        manifest=path,
        level=level,
        save_s=0.5,
        nbytes=4096,
        directive_id=None,
        uid=uid,
    )


async def test_a_whole_checkpoint_verifies(ckdir: str) -> None:
    path = write_checkpoint(ckdir, 100, 1)
    event = await verify_report(report(path))
    assert event.kind == Kind.CHECKPOINT and event.severity == Severity.INFO
    assert event.data["ok"] is True and event.data["reason"] == ""
    assert (event.data["shard_rank"], event.data["world_size"], event.data["files"]) == (1, 2, 1)
    assert event.data["root"] == os.path.join(ckdir, "step-000000100")


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete_shard", "delete_manifest", "link"])
async def test_a_damaged_checkpoint_is_rejected_with_its_reason(ckdir: str, damage: str) -> None:
    path = write_checkpoint(ckdir, 100, 1)
    shard = os.path.join(os.path.dirname(path), "rank-00001", "state.pt")
    if damage == "flip":
        flip_byte(shard, 100)
    elif damage == "truncate":
        os.truncate(shard, 1000)
    elif damage == "delete_shard":
        os.unlink(shard)
    elif damage == "delete_manifest":
        os.unlink(path)
    else:  # the shard replaced by a link to a file outside the checkpoint
        outside = os.path.join(ckdir, "secret")
        shutil.copy(shard, outside)
        os.unlink(shard)
        os.symlink(outside, shard)
    event = await verify_report(report(path))
    want = {
        "flip": "does not match its SHA-256",
        "truncate": "is 1000 bytes, the manifest says 4096",
        "delete_shard": "is missing",
        "delete_manifest": "cannot read the manifest",
        "link": "is not a regular file",
    }[damage]
    assert event.data["ok"] is False and event.severity == Severity.WARNING
    assert want in event.data["reason"]


async def test_a_manifest_that_disagrees_with_the_report_is_rejected(ckdir: str) -> None:
    path = write_checkpoint(ckdir, 100, 1)
    assert "for step 100, the rank said 101" in (await verify_report(report(path, 101))).data["reason"]
    assert (
        "level local, the rank said shared"
        in (await verify_report(report(path, level="shared"))).data["reason"]
    )


async def test_a_manifest_of_another_user_is_not_followed(ckdir: str) -> None:
    path = write_checkpoint(ckdir, 100, 1)
    os.chown(path, 65534, 65534)  # nobody's: a rank running as uid 1000 must not make root read it
    event = await verify_report(report(path, uid=1000))
    assert event.data["ok"] is False and "not to the rank's uid 1000: not followed" in event.data["reason"]
    assert (await verify_report(report(path, uid=65534))).data["ok"] is True


async def test_hostile_manifests_are_refused_never_followed(ckdir: str) -> None:
    step_dir = os.path.join(ckdir, "step-000000100")
    os.makedirs(step_dir)
    path = os.path.join(step_dir, mf.manifest_name(1))
    cases: dict[str, Any] = {
        "leaves or wanders the checkpoint directory": {
            "path": "../../etc/passwd",
            "size": 1,
            "sha256": "0" * 64,
        },
        "is absolute": {"path": "/etc/passwd", "size": 1, "sha256": "0" * 64},
    }
    for why, entry in cases.items():
        body = {
            "format": mf.FORMAT,
            "job": "j1",
            "step": 100,
            "rank": 1,
            "world_size": 2,
            "generation": 0,
            "level": "local",
            "created": 1.0,
            "save_s": None,
            "files": [entry],
        }
        write_bytes(path, json.dumps(body).encode())
        event = await verify_report(report(path))
        assert event.data["ok"] is False and why in event.data["reason"]
    write_bytes(path, b" " * (mf.MAX_MANIFEST_BYTES + 1))  # far over the size limit
    assert "bytes (at most" in (await verify_report(report(path))).data["reason"]
    write_bytes(path, b"[" * 100_000)  # not JSON: nested past any recursion limit
    assert "not readable JSON" in (await verify_report(report(path))).data["reason"]


async def test_the_local_api_verifies_a_reported_checkpoint_and_emits_one_event(
    sockdir: str, rec: Recorder, ckdir: str
) -> None:
    events: list[Event] = []

    async def on_event(event: Event) -> None:
        events.append(event)

    api = LocalApi(os.path.join(sockdir, "a.sock"), "node1", rec.on_presence, rec.on_ack, on_event=on_event)
    await api.start()
    try:
        peer = await Peer.open(api)
        await peer.register("j1", 1)
        good = write_checkpoint(ckdir, 100, 1)
        bad = write_checkpoint(ckdir, 200, 1)
        os.truncate(os.path.join(os.path.dirname(bad), "rank-00001", "state.pt"), 10)
        for step, path in ((100, good), (200, bad)):
            await peer.send(
                {
                    "v": 1,
                    "op": "checkpoint",
                    "step": step,
                    "manifest": path,
                    "level": "local",
                    "save_s": 0.5,
                    "bytes": 4096,
                    "directive_id": None,
                }
            )
        await peer.send(
            {"v": 1, "op": "checkpoint", "step": -1, "manifest": "relative/path", "level": "disk"}
        )
        answer = await peer.recv()
        assert answer["op"] == "error" and answer["re"] == "checkpoint"
        await until(lambda: len(events) == 2)
        by_step = {e.data["step"]: e for e in events}
        assert by_step[100].data["ok"] is True and by_step[100].node == "node1"
        assert by_step[200].data["ok"] is False and "is 10 bytes" in by_step[200].data["reason"]
        assert (by_step[100].data["job"], by_step[100].data["rank"]) == ("j1", 1)
        assert api.counters["checkpoints"] == 2 and api.counters["checkpoints_rejected"] == 1
        await peer.close()
    finally:
        await api.stop()


async def test_a_save_ack_naming_a_manifest_counts_only_once_it_verified(
    api: LocalApi, rec: Recorder, ckdir: str
) -> None:
    """The tier acks a save directive with its manifest: a whole one is relayed as sent, a damaged one
    reaches the coordinator as a failed save saying why; an ack naming no manifest is relayed as
    before (jobs that save their own way)."""
    peer = await Peer.open(api)
    await peer.register("j1", 1)
    good = write_checkpoint(ckdir, 100, 1)
    bad = write_checkpoint(ckdir, 200, 1)
    flip_byte(os.path.join(os.path.dirname(bad), "rank-00001", "state.pt"), 7)
    for directive, step, path in (("d-good", 100, good), ("d-bad", 200, bad), ("d-own", 300, "/ck/300")):
        await peer.send(
            {
                "v": 1,
                "op": "ack",
                "directive_id": directive,
                "ok": True,
                "step": step,
                "path": path,
                "reason": "",
            }
        )
    await until(lambda: len(rec.acks) == 3)
    acks = {a.directive_id: a for a in rec.acks}
    assert (acks["d-good"].ok, acks["d-good"].path) == (True, good)
    assert acks["d-bad"].ok is False and "did not verify" in acks["d-bad"].reason
    assert "SHA-256" in acks["d-bad"].reason
    assert (acks["d-own"].ok, acks["d-own"].path) == (True, "/ck/300")
    assert api.counters["acks_unverified"] == 1
    await peer.close()


async def test_the_verification_backlog_is_bounded_and_drains(
    sockdir: str, rec: Recorder, ckdir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank flooding the agent with reports while verifications are slow: past the backlog a report
    is answered with an error (counted) and a manifest-naming ack is relayed as a failed save, never
    queued; once the workers are done, reports are taken again."""
    from ftd.agent.local_api import server

    release = asyncio.Event()
    started: list[str] = []
    events: list[Event] = []

    async def slow(report: CheckpointReport) -> Event:
        started.append(report.manifest)
        await release.wait()
        return await verify_report(report)

    async def on_event(event: Event) -> None:
        events.append(event)

    monkeypatch.setattr(server, "MAX_VERIFY_BACKLOG", 2)
    monkeypatch.setattr(server, "verify_report", slow)
    api = LocalApi(os.path.join(sockdir, "a.sock"), "node1", rec.on_presence, rec.on_ack, on_event=on_event)
    await api.start()
    try:
        peer = await Peer.open(api)
        await peer.register("j1", 1)
        paths = [write_checkpoint(ckdir, step, 1) for step in (100, 200, 300, 400)]

        def op(step: int, path: str) -> dict[str, Any]:
            return {"v": 1, "op": "checkpoint", "step": step, "manifest": path, "level": "local"}

        await peer.send(op(100, paths[0]))
        await peer.send(op(200, paths[1]))
        await until(lambda: len(started) == 2, within=60)
        await peer.send(op(300, paths[2]))
        answer = await peer.recv()
        assert answer["op"] == "error" and answer["re"] == "checkpoint"
        assert "2 checkpoints already being verified" in answer["error"]
        ack = {"v": 1, "op": "ack", "directive_id": "d1", "ok": True, "step": 400, "path": paths[3]}
        await peer.send(ack)
        await until(lambda: len(rec.acks) == 1, within=60)
        assert rec.acks[0].ok is False and "already being verified" in (rec.acks[0].reason or "")
        assert api.counters["checkpoints_dropped"] == 1 and not events
        release.set()
        await until(lambda: len(events) == 2, within=60)
        await peer.send(op(300, paths[2]))  # the backlog drained: taken again
        await until(lambda: len(events) == 3, within=60)
        assert sorted(e.data["step"] for e in events) == [100, 200, 300]
        assert all(e.data["ok"] for e in events)
        await peer.close()
    finally:
        await api.stop()


def test_verification_works_in_every_event_loop_it_is_used_in(ckdir: str) -> None:
    """The worker bound is per event loop: an agent started again in the same process (or a second
    loop) verifies as well, with more reports than workers (a semaphore bound to the first loop
    raised RuntimeError in the second, and the reports got no event)."""
    from ftd.agent.checkpoints import MAX_CONCURRENT

    path = write_checkpoint(ckdir, 100, 1)

    async def many() -> list[Event]:
        return await asyncio.gather(*(verify_report(report(path)) for _ in range(MAX_CONCURRENT + 3)))

    for _ in range(2):
        events = asyncio.run(many())
        assert len(events) == MAX_CONCURRENT + 3 and all(e.data["ok"] for e in events)


async def test_a_verified_copy_deleted_since_is_said_at_the_ranks_next_report(
    sockdir: str, rec: Recorder, ckdir: str
) -> None:
    """The tier's retention (or an operator's rm) deletes step 100 after it verified: the rank's next
    report brings one ``deleted`` event for it, so the coordinator stops offering it as a resume point."""
    events: list[Event] = []

    async def on_event(event: Event) -> None:
        events.append(event)

    api = LocalApi(os.path.join(sockdir, "a.sock"), "node1", rec.on_presence, rec.on_ack, on_event=on_event)
    await api.start()
    try:
        peer = await Peer.open(api)
        await peer.register("j1", 1)

        async def reported(step: int, path: str, count: int) -> None:
            await peer.send({"v": 1, "op": "checkpoint", "step": step, "manifest": path, "level": "local"})
            await until(lambda: len(events) == count)

        first = write_checkpoint(ckdir, 100, 1)
        await reported(100, first, 1)
        second = write_checkpoint(ckdir, 200, 1)
        await reported(200, second, 2)  # step 100 still there: nothing said about it
        shutil.rmtree(os.path.dirname(first))
        await reported(300, write_checkpoint(ckdir, 300, 1), 4)
        deleted = [e for e in events if e.data.get("deleted")]
        assert [(e.data["step"], e.data["shard_rank"], e.data["level"], e.data["ok"]) for e in deleted] == [
            (100, 1, "local", False)
        ]
        assert deleted[0].node == "node1" and api.counters["checkpoints_deleted"] == 1
        assert api.counters.get("checkpoints_rejected", 0) == 0  # a deletion is no rejection
        await reported(400, write_checkpoint(ckdir, 400, 1), 5)  # said once, not at every report
        api.job_ended("j1")
        assert api.verified_copies._copies == {}
        await peer.close()
    finally:
        await api.stop()
