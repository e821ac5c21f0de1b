"""Hugging Face ``transformers.Trainer`` callback: ftd's save/stop through ``TrainerControl``.

::

    from ftd.client.hf import FtdTrainerCallback
    trainer = transformers.Trainer(..., callbacks=[FtdTrainerCallback()])

``on_step_end``: heartbeat, agree with the other ranks (:class:`ftd.client.torch.TorchCoordinator`
when torch.distributed is initialised), then set ``control.should_save`` (the Trainer writes
``output_dir/checkpoint-{global_step}`` right after this hook) and/or
``control.should_training_stop``. ``on_save`` acks with that checkpoint directory (every save the
Trainer makes answers a pending ftd save).

Install with ``pip install 'ftd-daemon[hf]'``. The hooks follow the documented ``TrainerCallback``
interface; the class only subclasses ``TrainerCallback`` at run time, so type checking does not
need transformers installed.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ftd.client import Client
from ftd.client.torch import TorchCoordinator

if TYPE_CHECKING:
    _TrainerCallback = object
else:
    from transformers import TrainerCallback as _TrainerCallback

__all__ = ["CHECKPOINT_PREFIX", "FtdTrainerCallback"]

CHECKPOINT_PREFIX = "checkpoint"  # transformers.trainer_utils.PREFIX_CHECKPOINT_DIR


class FtdTrainerCallback(_TrainerCallback):
    """``client``: an existing :class:`~ftd.client.Client` (default: one from the environment, with
    SIGUSR1/SIGTERM handlers when ``signals``). ``every``: agree every N steps."""

    def __init__(self, client: Client | None = None, *, every: int = 1, signals: bool = True) -> None:
        self._own_client = client is None
        self.client = client if client is not None else Client(signals=signals)
        self.coordinator = TorchCoordinator(self.client, every=every)
        self.last_checkpoint: str | None = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        step = int(state.global_step)
        self.client.heartbeat(step)
        save, stop = self.coordinator.agree(step)
        if save:
            control.should_save = True
        if stop:
            control.should_training_stop = True
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        step = int(state.global_step)
        path = os.path.join(str(args.output_dir), f"{CHECKPOINT_PREFIX}-{step}")
        self.coordinator.saved(step, path)
        self.last_checkpoint = path
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self._own_client:
            self.client.close()
        return control
