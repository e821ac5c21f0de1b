"""PyTorch Lightning callback: ftd's save/stop for a ``lightning.pytorch.Trainer``.

::

    from ftd.client.lightning import FtdCallback
    trainer = lightning.Trainer(callbacks=[FtdCallback()])

After every training batch (``on_train_batch_end``) it heart-beats, agrees with the other ranks
(:class:`ftd.client.torch.TorchCoordinator`, when torch.distributed is initialised), and then

- save: ``trainer.save_checkpoint(dirpath/ftd-step{N}.ckpt)`` on every rank (Lightning's rule: the
  strategy decides who writes) and ack with that path;
- stop: ``trainer.should_stop = True`` (Lightning ends the fit loop cleanly).

Install with ``pip install 'ftd-daemon[lightning]'`` (``lightning`` or the older ``pytorch_lightning``).
The hooks follow Lightning's documented ``Callback`` interface; the class only subclasses
Lightning's ``Callback`` at run time, so type checking does not need Lightning installed.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ftd.client import Client
from ftd.client.torch import TorchCoordinator

if TYPE_CHECKING:
    _Callback = object
else:
    try:
        from lightning.pytorch import Callback as _Callback
    except ImportError:  # the pre-2.0 package name
        from pytorch_lightning import Callback as _Callback

__all__ = ["FtdCallback"]


class FtdCallback(_Callback):
    """``client``: an existing :class:`~ftd.client.Client` (default: one from the environment, with
    SIGUSR1/SIGTERM handlers when ``signals``). ``every``: agree every N steps. ``dirpath``: where
    ftd-requested checkpoints go (default ``trainer.default_root_dir/ftd-checkpoints``)."""

    def __init__(
        self,
        client: Client | None = None,
        *,
        every: int = 1,
        dirpath: str | None = None,
        signals: bool = True,
    ) -> None:
        super().__init__()
        self._own_client = client is None
        self.client = client if client is not None else Client(signals=signals)
        self.coordinator = TorchCoordinator(self.client, every=every)
        self.dirpath = dirpath
        self.last_checkpoint: str | None = None

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = int(trainer.global_step)
        self.client.heartbeat(step)
        save, stop = self.coordinator.agree(step)
        if save:
            dirpath = self.dirpath or os.path.join(str(trainer.default_root_dir), "ftd-checkpoints")
            path = os.path.join(dirpath, f"ftd-step{step}.ckpt")
            trainer.save_checkpoint(path)
            self.coordinator.saved(step, path)
            self.last_checkpoint = path
        if stop:
            trainer.should_stop = True

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self._own_client:
            self.client.close()
