"""The checkpoint tier in one process (torch, CPU, real files): the write happens off the training
thread, a save that finds the previous one still running waits and, past ``busy_wait_s``, is skipped
and said; a save directive is answered after the manifest is on disk and names it; a level that
cannot take a save is skipped, the directive nacked with the reason, and training not blocked."""

from __future__ import annotations

import itertools
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from ftd.client import Client
from ftd.client import manifest as mf

torch = pytest.importorskip("torch")


def _state(value: float = 1.0) -> dict[str, Any]:
    return {"model": {"w": torch.full((64, 64), value)}, "extra": {"step": 7, "names": ["a", "b"]}}


def _client() -> Client:
    return Client(job="j", rank=0, connect=False)


def _sent(client: Client) -> list[dict[str, Any]]:
    return [json.loads(m) for m in client._outbox]


def _gate_writes(monkeypatch: pytest.MonkeyPatch, *, one_per_set: bool) -> threading.Event:
    """Every local write waits for the returned event; ``one_per_set``: each write clears it as it
    passes, so one save lands per ``set()``."""
    from ftd.client import checkpoint

    gate = threading.Event()
    real = checkpoint._write_state

    def held(directory: str, staged: Any) -> mf.FileEntry:
        assert gate.wait(60), "the test never released the write"
        if one_per_set:
            gate.clear()
        return real(directory, staged)

    monkeypatch.setattr(checkpoint, "_write_state", held)
    return gate


@pytest.fixture
def held_write(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """The local write waits for this event: the test holds the background thread mid-save."""
    return _gate_writes(monkeypatch, one_per_set=False)


def test_save_returns_before_the_write_and_the_snapshot_is_a_copy(
    tmp_path: Path, held_write: threading.Event
) -> None:
    from ftd.client.checkpoint import CheckpointTier

    tier = CheckpointTier(None, str(tmp_path / "local"), str(tmp_path / "shared"), every_k_flush=1)
    state = _state(1.0)
    tier.save(7, state)  # returns although the write is held
    assert tier.history == [] and not tier.wait(0.05)
    state["model"]["w"].fill_(99.0)  # training goes on and changes the tensors in place
    held_write.set()
    assert tier.wait(60)
    local = tmp_path / "local/step-000000007/rank-00000.manifest.json"
    m, why = mf.verify(str(local))
    assert why == "" and m is not None and m.level == "local"
    loaded = torch.load(local.parent / "rank-00000/state.pt", weights_only=True)
    assert torch.equal(loaded["model"]["w"], torch.full((64, 64), 1.0)), (
        "the save saw training's later change"
    )
    assert loaded["extra"] == {"step": 7, "names": ["a", "b"]}
    assert mf.verify(str(tmp_path / "shared/step-000000007/rank-00000.manifest.json"))[1] == ""


def test_a_save_while_the_previous_still_runs_waits_then_is_skipped(
    tmp_path: Path, held_write: threading.Event
) -> None:
    from ftd.client.checkpoint import CheckpointTier

    tier = CheckpointTier(None, str(tmp_path), None, busy_wait_s=0.05)
    tier.save(1, _state())
    tier.save(2, _state())  # the first is held: this one waits 0.05 s, then is skipped and said
    assert tier.history[-1]["step"] == 2 and "still runs" in tier.history[-1]["skipped"]
    # Stuck: the next save is skipped at once, not after another busy_wait_s (it would block training
    # once per save for as long as the partner or the disk does not answer).
    tier.busy_wait_s = 3600.0
    third = threading.Thread(target=tier.save, args=(3, _state()))
    third.start()
    third.join(30)
    assert not third.is_alive(), "a save waited again for a save already known stuck"
    assert tier.history[-1]["step"] == 3 and "skipped" in tier.history[-1]
    held_write.set()
    assert tier.wait(60)
    assert [h["step"] for h in tier.history] == [2, 3, 1]
    assert not (tmp_path / "step-000000002").exists()
    # once the stuck save ended, saves run again (without the partner level)
    tier.save(4, _state())
    assert tier.wait(60) and tier.history[-1]["step"] == 4 and "local_s" in tier.history[-1]


def test_a_directive_is_acked_with_the_manifest_after_it_is_written(tmp_path: Path) -> None:
    from ftd.client.checkpoint import CheckpointTier

    client = _client()
    client._on_directive({"id": "d1", "action": "save", "job": "j"}, 0)
    tier = CheckpointTier(client, str(tmp_path), None)
    assert client.should_save()
    tier.save(3, _state())
    assert not client.should_save(), "the save stayed pending after the snapshot"
    assert tier.wait(60)
    manifest = str(tmp_path / "step-000000003/rank-00000.manifest.json")
    sent = _sent(client)
    assert [(m["op"], m.get("directive_id")) for m in sent] == [("checkpoint", "d1"), ("ack", "d1")]
    assert sent[0]["manifest"] == manifest and sent[0]["level"] == "local" and sent[0]["bytes"] > 0
    assert sent[1]["ok"] is True and sent[1]["path"] == manifest and sent[1]["step"] == 3


def test_a_level_that_cannot_take_the_save_is_skipped_and_the_directive_nacked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ftd.client import checkpoint

    monkeypatch.setattr(checkpoint, "probe", lambda path, need=0, timeout_s=5.0: f"{path}: full (test)")
    client = _client()
    client._on_directive({"id": "d9", "action": "save", "job": "j"}, 0)
    tier = checkpoint.CheckpointTier(client, str(tmp_path / "l"), str(tmp_path / "s"), every_k_flush=1)
    tier.save(5, _state())
    assert tier.wait(60)
    assert "full (test)" in tier.history[-1]["local"]
    [ack] = _sent(client)
    assert ack["op"] == "ack" and ack["ok"] is False and "full (test)" in ack["reason"]
    assert not (tmp_path / "l/step-000000005").exists()


def test_retention_keeps_the_newest_saves(tmp_path: Path) -> None:
    from ftd.client.checkpoint import CheckpointTier, steps_in

    tier = CheckpointTier(None, str(tmp_path / "l"), str(tmp_path / "s"), every_k_flush=2, keep=2)
    for step in range(1, 7):
        tier.save(step, _state(step))
        assert tier.wait(60)
    assert steps_in(str(tmp_path / "l")) == [5, 6]
    assert steps_in(str(tmp_path / "s")) == [4, 6]


def test_load_resume_single_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ftd.client.checkpoint import CheckpointTier
    from ftd.client.resume import load_resume

    for name in ("FTD_RESUME_STEP", "FTD_RESUME_PATH", "FTD_RESUME_LEVEL", "RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    assert load_resume(str(tmp_path / "l"), str(tmp_path / "s")) is None
    tier = CheckpointTier(None, str(tmp_path / "l"), str(tmp_path / "s"), every_k_flush=1, keep=3)
    for step in (10, 20):
        tier.save(step, _state(step))
        assert tier.wait(60)
    r = load_resume(str(tmp_path / "l"), str(tmp_path / "s"))
    assert r is not None and (r.step, r.level) == (20, "local")
    assert torch.equal(r.state["model"]["w"], torch.full((64, 64), 20.0))
    # the local copy corrupt: the shared one is loaded, never the corrupt bytes
    state = tmp_path / "l/step-000000020/rank-00000/state.pt"
    data = bytearray(state.read_bytes())
    data[-100] ^= 1
    state.write_bytes(bytes(data))
    r = load_resume(str(tmp_path / "l"), str(tmp_path / "s"))
    assert r is not None and (r.step, r.level) == (20, "shared")
    # the coordinator's choice wins
    monkeypatch.setenv("FTD_RESUME_STEP", "10")
    monkeypatch.setenv("FTD_RESUME_PATH", str(tmp_path / "s/step-000000010"))
    monkeypatch.setenv("FTD_RESUME_LEVEL", "shared")
    r = load_resume(str(tmp_path / "l"), str(tmp_path / "s"))
    assert r is not None and (r.step, r.level) == (10, "shared")
    assert r.manifest == str(tmp_path / "s/step-000000010/rank-00000.manifest.json")
    # a step nobody can load (damaged after it verified, or gone): the newest older step every rank
    # loads, said in the log -- not a raise on every rank that fails the restart for good
    monkeypatch.setenv("FTD_RESUME_STEP", "15")
    monkeypatch.delenv("FTD_RESUME_PATH")
    r = load_resume(str(tmp_path / "l"), str(tmp_path / "s"))
    assert r is not None and r.step == 10
    # nothing older either: a clear error naming what was refused, not a fresh start
    monkeypatch.setenv("FTD_RESUME_STEP", "5")
    with pytest.raises(RuntimeError, match="step 5: no verified checkpoint"):
        load_resume(str(tmp_path / "l"), str(tmp_path / "s"))


def test_a_state_that_cannot_be_saved_is_nacked_not_left_pending(tmp_path: Path) -> None:
    from ftd.client.checkpoint import CheckpointTier

    client = _client()
    client._on_directive({"id": "d2", "action": "save", "job": "j"}, 0)
    tier = CheckpointTier(client, str(tmp_path), None)
    tier.save(4, {"model": {"w": torch.ones(2)}, "extra": {"handle": threading.Lock()}})
    assert tier.wait(60)
    [ack] = _sent(client)
    assert ack["op"] == "ack" and ack["ok"] is False and "local save failed" in ack["reason"]
    assert not (tmp_path / "step-000000004" / "rank-00000.manifest.json").exists()


def test_a_snapshot_that_fails_is_said_and_skipped(tmp_path: Path) -> None:
    from ftd.client.checkpoint import CheckpointTier

    client = _client()
    client._on_directive({"id": "d3", "action": "save", "job": "j"}, 0)
    tier = CheckpointTier(client, str(tmp_path), None)
    tier.save(6, {"model": {"w": torch.empty(4, device="meta")}})  # no data to copy: copy_ raises
    assert "the snapshot failed" in tier.history[-1]["skipped"]
    assert client.should_save(), "the directive was taken by a save that never happened"
    tier.save(7, _state())  # the tier still works, and this save answers the directive
    assert tier.wait(60)
    assert [m["op"] for m in _sent(client)] == ["checkpoint", "ack"]


# --- agreeing on the partners (a choice changed mid-run) -----------------------------------------


def _pairing(views: list[Any], hosts: list[str]) -> list[int | None]:
    from ftd.client.checkpoint import agree_partners, partner_ranks

    return partner_ranks(hosts, agree_partners(views)[1])


def test_the_newest_choice_any_rank_holds_is_agreed_even_by_ranks_that_lack_it() -> None:
    from ftd.client.checkpoint import agree_partners

    old = {"a": "b", "b": "c", "c": "a"}
    new = {"a": "c", "b": "a", "c": "b"}
    # Rank 1's agent delivered version 7; ranks 0 and 2 still hold 5: all apply 7 from the gathered list.
    assert agree_partners([(5, old), (7, new), (5, old)]) == (7, new)
    assert agree_partners([None, None]) == (-1, {})  # none anywhere: the next node
    assert agree_partners([None, (0, old)]) == (0, old)  # an unversioned op (older agent) beats none
    # Equal versions with different maps (two old coordinators): the lowest rank's, on every rank.
    assert agree_partners([(3, old), (3, new)]) == (3, old)
    # What is not a (version, dict) pair is ignored, never applied.
    assert agree_partners([("9", new), (True, new), (4, "x"), [2, old], (1, 2, 3)]) == (2, old)


def test_every_rank_computes_the_same_consistent_pairing_from_the_gathered_views() -> None:
    hosts = ["a", "a", "b", "b", "c", "c"]  # two ranks per node
    views = [(1, {"a": "b", "b": "c", "c": "a"})] * 3 + [(2, {"a": "c", "b": "a", "c": "b"})] * 3
    targets = _pairing(views, hosts)
    assert targets == [4, 5, 0, 1, 2, 3]  # same place on the new partner node
    # A rank's list of sources is where the others send: every send has exactly one receiver.
    for rank in range(len(hosts)):
        recv_from = [src for src, dst in enumerate(targets) if dst == rank]
        assert all(targets[src] == rank for src in recv_from)
    assert sorted(t for t in targets if t is not None) == list(range(len(hosts)))
    # Before the change reached any rank: the old choice.
    assert _pairing(views[:3] * 2, hosts) == [2, 3, 4, 5, 0, 1]


@pytest.fixture
def held_copy(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """An overlapped snapshot's background copy waits for this event (a copy still running)."""
    from ftd.client import checkpoint

    release = threading.Event()
    real = checkpoint.copy_deferred

    def slow(pending: Any) -> None:
        assert release.wait(60), "the test never released the copy"
        real(pending)

    monkeypatch.setattr(checkpoint, "copy_deferred", slow)
    return release


def test_overlap_the_optimizer_step_waits_for_the_copy_and_the_save_holds_the_values_it_was_given(
    tmp_path: Path, held_copy: threading.Event
) -> None:
    """With ``overlap`` the large tensors are copied behind training; a torch optimizer's step waits
    for that copy (the tier's pre-hook), so the checkpoint holds the weights as they were at save(),
    not after the step; a small tensor changed in place before the step (a normalisation statistic
    in the forward pass) was copied at save() already."""
    from ftd.client.checkpoint import CheckpointTier

    weight = torch.nn.Parameter(torch.full((1024, 1024), 1.0))  # 4 MiB: copied behind training
    stats = torch.zeros(16)  # 64 bytes: copied at once
    opt = torch.optim.SGD([weight], lr=1.0)
    tier = CheckpointTier(None, str(tmp_path / "local"), None, overlap=True)
    try:
        blocked = tier.save(3, {"model": {"w": weight.detach(), "bn": stats}, "extra": {"step": 3}})
        assert blocked < 60 and not tier.wait_snapshot(0.05), "the copy is held: not done yet"
        stats.add_(5.0)  # the next forward pass updates a running statistic
        weight.grad = torch.full_like(weight, 2.0)
        stepper = threading.Thread(target=opt.step)
        stepper.start()
        stepper.join(0.3)
        assert stepper.is_alive(), "the optimizer step ran before the snapshot's copy was done"
        assert torch.equal(weight.detach(), torch.full((1024, 1024), 1.0))
        held_copy.set()
        stepper.join(60)
        assert not stepper.is_alive() and torch.equal(weight.detach(), torch.full((1024, 1024), -1.0))
        assert tier.wait(60) and len(tier.step_waits) == 1 and tier.step_waits[0] >= 0.25
        loaded = torch.load(tmp_path / "local/step-000000003/rank-00000/state.pt", weights_only=True)
        assert torch.equal(loaded["model"]["w"], torch.full((1024, 1024), 1.0)), "the step's update leaked in"
        assert torch.equal(loaded["model"]["bn"], torch.zeros(16)), "the forward's update leaked in"
        assert mf.verify(str(tmp_path / "local/step-000000003/rank-00000.manifest.json"))[1] == ""
        assert "copy_s" in tier.history[-1] and "error" not in tier.history[-1]
    finally:
        held_copy.set()
        tier.close(60)
    # closed: the hook is gone, a step never waits on this tier again
    tier._copied.clear()
    weight.grad = torch.zeros_like(weight)
    opt.step()


def test_overlap_a_copy_that_fails_writes_nothing_and_never_holds_a_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ftd.client import checkpoint
    from ftd.client.checkpoint import CheckpointTier

    def broken(pending: Any) -> None:
        raise RuntimeError("copy failed half way")

    monkeypatch.setattr(checkpoint, "copy_deferred", broken)
    weight = torch.nn.Parameter(torch.ones(512, 1024))
    opt = torch.optim.SGD([weight], lr=0.1)
    tier = CheckpointTier(None, str(tmp_path / "local"), None, overlap=True)
    try:
        tier.save(4, {"w": weight.detach()})
        weight.grad = torch.ones_like(weight)
        opt.step()  # returns: the failed copy released the step
        assert tier.wait(60)
        assert "copy failed half way" in tier.history[-1]["error"]
        assert not (tmp_path / "local/step-000000004/rank-00000.manifest.json").exists(), (
            "a half-filled snapshot must never become a checkpoint"
        )
    finally:
        tier.close(60)


def test_without_overlap_no_hook_is_installed(tmp_path: Path) -> None:
    from ftd.client.checkpoint import CheckpointTier

    weight = torch.nn.Parameter(torch.ones(1024, 1024))
    tier = CheckpointTier(None, str(tmp_path / "local"), None)
    tier.save(1, {"w": weight.detach()})  # the whole copy inside save()
    weight.data.fill_(7.0)  # changed at once, no step, no wait: the save still holds the ones
    assert tier.wait(60) and tier.step_waits == []
    loaded = torch.load(tmp_path / "local/step-000000001/rank-00000/state.pt", weights_only=True)
    assert torch.equal(loaded["w"], torch.ones(1024, 1024))
    tier.close()


@pytest.fixture
def write_gate(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Each local write waits until this event is set, then clears it: one save lands per set."""
    return _gate_writes(monkeypatch, one_per_set=True)


def _train_with_saves(
    tmp_path: Path, gate: threading.Event, *, every: int, lag: int, steps: int, planned: bool
) -> tuple[list[int], dict[int, int]]:
    """A loop of ``steps`` steps whose every save lands exactly ``lag`` steps after its snapshot (the
    write is held until the loop has trained that many more); saves at ``tier.due`` (``planned``) or
    at ``step % every``. Returns the saves' steps and each save's landing step."""
    from ftd.client.checkpoint import CheckpointTier

    tier = CheckpointTier(None, str(tmp_path / ("planned" if planned else "modulo")), None, keep=1)
    saves: list[int] = []
    landed: dict[int, int] = {}
    for step in range(1, steps + 1):
        due = tier.due(step, every) if planned else step % every == 0
        if saves and saves[-1] not in landed and step - saves[-1] == lag:
            gate.set()  # the in-flight save lands now, `lag` steps after its snapshot
            assert tier.wait(60)
            landed[saves[-1]] = step
        if due:
            tier.save(step, _state(float(step)))
            saves.append(step)
    gate.set()
    tier.close(60)
    return saves, landed


def _worst_loss(saves: list[int], landed: dict[int, int], kills: range) -> int:
    """The most steps lost by a node killed after any step in ``kills``: back to the newest save that
    had landed before the step (a save landing during the killed step is counted as lost)."""
    worst = 0
    for kill in kills:
        safe = [s for s in saves if landed.get(s, kill) < kill]
        worst = max(worst, kill - max(safe, default=0))
    return worst


def test_due_plans_saves_so_a_node_killed_mid_save_loses_at_most_one_interval(
    tmp_path: Path, write_gate: threading.Event
) -> None:
    """A save is safe from its node's loss only once it landed; saved every ``every`` steps, a kill
    just before a save lands loses ``every`` plus the steps it was in flight. ``due`` measures that
    lag and saves ``lag + 1`` steps earlier, so no kill loses more than ``every`` (from the second
    save's landing on: the first interval is planned before any lag is known)."""
    every, lag = 10, 3
    modulo, modulo_landed = _train_with_saves(
        tmp_path, write_gate, every=every, lag=lag, steps=80, planned=False
    )
    assert _worst_loss(modulo, modulo_landed, range(modulo[1] + lag + 1, 81)) == every + lag
    saves, landed = _train_with_saves(tmp_path, write_gate, every=every, lag=lag, steps=80, planned=True)
    assert saves[:3] == [10, 19, 25], "the first save at a multiple of every, then every - lag - 1 steps"
    assert {b - a for a, b in itertools.pairwise(saves[1:])} == {every - lag - 1}
    assert _worst_loss(saves, landed, range(saves[1] + lag + 1, 81)) <= every
    assert {s: landed[s] - s for s in landed} == dict.fromkeys(landed, lag)


def test_due_rejects_a_non_positive_interval(tmp_path: Path) -> None:
    from ftd.client.checkpoint import CheckpointTier

    tier = CheckpointTier(None, str(tmp_path), None)
    with pytest.raises(ValueError, match="every"):
        tier.due(1, 0)


def test_due_after_a_skipped_save_waits_an_interval_not_a_step(
    tmp_path: Path, held_write: threading.Event
) -> None:
    """A save skipped because the one before is stuck counts as the interval's save: ``due`` does not
    ask again at every step (a skip and a warning per step) while the stuck save lasts."""
    from ftd.client.checkpoint import CheckpointTier

    tier = CheckpointTier(None, str(tmp_path), None, busy_wait_s=0.05)
    asked = []
    for step in range(1, 31):
        if tier.due(step, 10):
            tier.save(step, _state())
            asked.append(step)
    held_write.set()
    assert tier.wait(60)
    assert asked == [10, 19, 28], asked
    assert [h["step"] for h in tier.history if "skipped" in h] == [19, 28]
