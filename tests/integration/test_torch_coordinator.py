"""ftd.client.torch: every rank acts on the same step (2 real gloo processes on CPU), and the
Lightning / Hugging Face callbacks against stand-ins with their documented hook signatures."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def _needs_torch() -> None:
    """Skips without torch. torch (and ftd.client.torch, which imports it) is imported by the tests
    that run, not when the module is collected: it takes seconds, and ``-k`` selections pay it too."""
    pytest.importorskip("torch", reason="pip install 'ftd-daemon[torch]'")


class FakeClient:
    """The Client members TorchCoordinator uses, scriptable per step."""

    def __init__(self) -> None:
        self.save = False
        self.directive = False
        self.stop = False
        self.acks: list[tuple[int, str | None]] = []
        self.beats: list[int | None] = []
        self.waits: list[float] = []

    def heartbeat(self, step: int | None = None) -> None:
        self.beats.append(step)

    def waited(self, seconds: float) -> None:  # time blocked in a collective (issue #33's step timing)
        self.waits.append(seconds)

    def should_save(self) -> bool:
        return self.save or self.directive

    @property
    def save_directive_pending(self) -> bool:
        return self.directive

    def should_stop(self) -> bool:
        return self.stop

    def ack_saved(self, step: int, path: str | None = None) -> None:
        if self.save or self.directive:
            self.acks.append((step, path))
        self.save = self.directive = False


def _worker(rank: int, store_path: str, out: str) -> None:
    import torch.distributed as dist

    from ftd.client.torch import TorchCoordinator

    store = dist.FileStore(store_path, 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    client = FakeClient()
    coord = TorchCoordinator(client)  # type: ignore[arg-type]
    log: list[Any] = []

    def step(n: int) -> None:
        save, stop = coord.agree(n)
        if save:
            coord.saved(n, f"/ckpt/{n}")
        log.append([n, save, stop, list(client.acks)])

    client.save = rank == 1  # a local trigger (SIGUSR1, save file) on rank 1 only
    step(1)
    client.directive = rank == 0  # rank 0's save directive arrived, rank 1's not yet
    step(2)
    client.directive = rank == 1  # ...now it has: answered with step 2's checkpoint, no new save
    step(3)
    step(4)
    client.stop = rank == 1
    step(5)
    every = TorchCoordinator(client, every=2)  # type: ignore[arg-type]
    log.append([every.agree(7), every.agree(8), every.reductions])
    Path(out, f"{rank}.json").write_text(json.dumps(log))
    dist.destroy_process_group()


def test_ranks_agree_on_the_step_and_a_late_directive_is_answered_with_the_peer_save(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    mp.start_processes(_worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2, start_method="spawn")
    r0, r1 = (json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1))
    for log in (r0, r1):
        assert [entry[:3] for entry in log[:5]] == [
            [1, True, False],  # rank 1's local trigger: both save at step 1
            [2, True, False],  # rank 0's directive: both save at step 2
            [3, False, False],  # rank 1's late directive does not cause a second save
            [4, False, False],
            [5, False, True],  # rank 1's stop: both stop at step 5
        ]
        assert log[5] == [[False, False], [False, True], 1]  # every=2: step 7 skipped, 8 reduced
    assert r0[4][3] == [(2, "/ckpt/2")] or r0[4][3] == [[2, "/ckpt/2"]]
    assert r1[4][3] == [[1, "/ckpt/1"], [2, "/ckpt/2"]]  # local save acked; directive acked with step 2


def test_without_a_process_group_the_local_flags_are_returned() -> None:
    from ftd.client.torch import agree

    client = FakeClient()
    assert agree(client) == (False, False)  # type: ignore[arg-type]
    client.directive, client.stop = True, True
    assert agree(client) == (True, True)  # type: ignore[arg-type]


# --- callbacks: stand-ins shaped like the documented hook arguments --------------------------------


def test_lightning_callback_saves_through_the_trainer_and_stops_it(tmp_path: Path) -> None:
    pytest.importorskip("lightning", reason="pip install 'ftd-daemon[lightning]'")
    from ftd.client.lightning import FtdCallback

    client = FakeClient()
    callback = FtdCallback(client)  # type: ignore[arg-type]
    saved: list[str] = []
    trainer = SimpleNamespace(
        global_step=12, default_root_dir=str(tmp_path), should_stop=False, save_checkpoint=saved.append
    )
    callback.on_train_batch_end(trainer, None, None, None, 0)
    assert saved == [] and not trainer.should_stop
    client.directive = True
    callback.on_train_batch_end(trainer, None, None, None, 1)
    expected = os.path.join(str(tmp_path), "ftd-checkpoints", "ftd-step12.ckpt")
    assert saved == [expected] and client.acks == [(12, expected)]
    client.stop = True
    callback.on_train_batch_end(trainer, None, None, None, 2)
    assert trainer.should_stop


def test_hf_callback_sets_trainer_control_and_acks_on_save(tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="pip install 'ftd-daemon[hf]'")
    from transformers import TrainerControl, TrainerState

    from ftd.client.hf import FtdTrainerCallback

    client = FakeClient()
    callback = FtdTrainerCallback(client)  # type: ignore[arg-type]
    args, state, control = SimpleNamespace(output_dir=str(tmp_path)), TrainerState(), TrainerControl()
    state.global_step = 30
    callback.on_step_end(args, state, control)
    assert not control.should_save and not control.should_training_stop
    client.directive = True
    callback.on_step_end(args, state, control)
    assert control.should_save
    callback.on_save(args, state, control)  # what Trainer calls after writing checkpoint-30
    assert client.acks == [(30, os.path.join(str(tmp_path), "checkpoint-30"))]
    client.stop = True
    callback.on_step_end(args, state, control)
    assert control.should_training_stop


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
