"""Every rank of a torch.distributed job acts on the same step: agree on the save/stop flags.

A ``save`` directive reaches the ranks of a job through different agents at slightly different
times, and local triggers (SIGUSR1, the switch files, the memory guard) fire on one rank only. If
each rank acted on its own flag, rank 0 would save step 1200 and rank 7 step 1201: no consistent
checkpoint. So, every ``every`` steps, the ranks all-reduce (MAX) a 2-element int tensor of their
flags, and all act on the result::

    from ftd.client import Client
    from ftd.client.torch import TorchCoordinator

    client = Client()
    coord = TorchCoordinator(client, every=1)
    for step in range(start, steps):
        train_step()
        client.heartbeat(step)
        save, stop = coord.agree(step)
        if save:
            coord.saved(step, save_checkpoint(step))  # acks the directive
        if stop:
            break

The tensor lives where the process group's backend wants it (CPU for gloo, the current CUDA device
for nccl), is allocated once and reused. The save element says *why*: 0 nothing, 1 a local trigger
only, 2 a ``save`` directive is pending on some rank. That distinction handles the race seen in
``ftd.sim.cluster``: a rank whose own directive has not arrived yet saves because a peer's has;
when its directive then arrives (usually milliseconds later), it must not save again at a different
step but answer with the checkpoint it already wrote. :meth:`TorchCoordinator.saved` remembers such
a checkpoint ("owed" to a directive) for ``owed_ttl_s`` seconds and :meth:`agree` acks the late
directive with it.

Slow ranks (issue #33): a rank's step lasts as long as its slowest peer's, so what tells a slow
rank is the time it spends *waiting* in collectives (the slow one waits least). :func:`time_collectives`
registers a DDP communication hook (the default all-reduce, timed) on a ``DistributedDataParallel``
model: the last gradient bucket of each backward is where a rank blocks for its peers, and the time
from its launch to its completion is reported with :meth:`Client.waited <ftd.client.Client.waited>`;
:meth:`TorchCoordinator.agree` reports its own all-reduce the same way. The client sends the
resulting compute time with its heartbeats (:mod:`ftd.client.timing`)::

    model = DistributedDataParallel(net)
    time_collectives(model, client)

Without an initialised process group (single process) ``agree`` returns the local flags. A failing
collective is *not* swallowed: it means the job's process group is broken, and hiding that would
desynchronise the ranks' collectives; the training step's own collectives would fail the same way.
"""

from __future__ import annotations

import collections
import time
import weakref
from typing import Any

import torch
import torch.distributed as dist

from ftd.client import Client

__all__ = ["TorchCoordinator", "agree", "time_collectives"]

SAVE_NONE, SAVE_LOCAL, SAVE_DIRECTIVE = 0, 1, 2


class TorchCoordinator:
    """Agree on save/stop across the ranks of ``group`` (the default group when None).

    ``every``: all-reduce only on calls where ``step % every == 0`` (or every ``every``-th call when
    no step is given); other calls return ``(False, False)`` at no cost. Every rank must use the same
    ``every`` and the same step numbers, since each agreement is a collective.
    """

    def __init__(
        self,
        client: Client,
        group: Any = None,
        *,
        every: int = 1,
        device: torch.device | str | None = None,
        owed_ttl_s: float = 60.0,
    ) -> None:
        if every < 1:
            raise ValueError("every must be >= 1")
        self.client = client
        self.group = group
        self.every = every
        self.owed_ttl_s = owed_ttl_s
        self._device = torch.device(device) if device is not None else None
        self._buf: torch.Tensor | None = None
        self._calls = 0
        self._peer_directive = False  # the last agreed save was for a directive we had not received
        self._owed: tuple[int, str | None, float] | None = None  # (step, path, monotonic time)
        #: How many all-reduces this coordinator ran (for tests and benchmarks).
        self.reductions = 0

    # --- helpers ---------------------------------------------------------------------------------

    @staticmethod
    def distributed() -> bool:
        return dist.is_available() and dist.is_initialized()

    def _tensor_device(self) -> torch.device:
        if self._device is None:
            backend = str(dist.get_backend(self.group)).lower()
            if "nccl" in backend and torch.cuda.is_available():
                self._device = torch.device("cuda", torch.cuda.current_device())
            else:
                self._device = torch.device("cpu")
        return self._device

    def _local(self) -> tuple[int, int]:
        client = self.client
        wants = client.should_save()
        directive = client.save_directive_pending
        if directive and self._owed is not None:
            step, path, at = self._owed
            self._owed = None
            if time.monotonic() - at <= self.owed_ttl_s:
                # Our directive arrived after a peer's made us save: that checkpoint answers it.
                client.ack_saved(step, path)
                wants, directive = client.should_save(), client.save_directive_pending
        # A directive asking for a later step (save_at_step) is not wanted yet: should_save says when.
        save = SAVE_DIRECTIVE if directive and wants else (SAVE_LOCAL if wants else SAVE_NONE)
        return save, 1 if client.should_stop() else 0

    # --- the per-step call -----------------------------------------------------------------------

    def agree(self, step: int | None = None) -> tuple[bool, bool]:
        """Return ``(save, stop)`` as agreed by every rank (see the class docstring for ``every``)."""
        self._calls += 1
        if self.every > 1 and (step if step is not None else self._calls) % self.every:
            return False, False
        save, stop = self._local()
        if not self.distributed():
            self._peer_directive = False
            return save != SAVE_NONE, bool(stop)
        if self._buf is None:
            self._buf = torch.zeros(2, dtype=torch.int32, device=self._tensor_device())
        buf = self._buf
        if buf.device.type == "cpu":
            buf[0], buf[1] = save, stop
        else:
            buf.copy_(torch.tensor([save, stop], dtype=torch.int32), non_blocking=False)
        began = time.monotonic()
        dist.all_reduce(buf, op=dist.ReduceOp.MAX, group=self.group)
        self.reductions += 1
        agreed_save, agreed_stop = (int(v) for v in buf.tolist())
        self.client.waited(time.monotonic() - began)  # blocked for the slowest peer (issue #33)
        self._peer_directive = agreed_save == SAVE_DIRECTIVE and save != SAVE_DIRECTIVE
        return agreed_save != SAVE_NONE, bool(agreed_stop)

    def saved(self, step: int, path: str | None = None) -> None:
        """Report the checkpoint written after ``agree`` said save: acks this rank's pending save
        (directive and local triggers); if the save was for a peer's directive this rank has not
        received yet, keep it to answer that directive when it arrives."""
        self.client.ack_saved(step, path)
        self._owed = (step, path, time.monotonic()) if self._peer_directive else None
        self._peer_directive = False


_COORDINATORS: weakref.WeakKeyDictionary[Client, TorchCoordinator] = weakref.WeakKeyDictionary()


def agree(client: Client, group: Any = None) -> tuple[bool, bool]:
    """``(save, stop)`` agreed by every rank of ``group``: one :class:`TorchCoordinator` per client
    (created on first use; report the checkpoint with ``coordinator_for(client).saved(...)`` or
    plain ``client.ack_saved`` if the peer-directive case does not matter to you)."""
    return coordinator_for(client, group).agree()


def coordinator_for(client: Client, group: Any = None) -> TorchCoordinator:
    coordinator = _COORDINATORS.get(client)
    if coordinator is None or coordinator.group is not group:
        coordinator = _COORDINATORS[client] = TorchCoordinator(client, group)
    return coordinator


def time_collectives(model: Any, client: Client, process_group: Any = None) -> None:
    """Register on the ``DistributedDataParallel`` ``model`` a communication hook that all-reduces the
    gradients as DDP's default does (averaged over ``process_group``, the default group when None) and
    reports to ``client`` how long the step's last bucket took from its launch to its completion:
    where a rank blocks at the end of its backward pass until the slowest rank has caught up. Call
    it once, before the first step (DDP accepts one hook per model).

    CPU tensors (gloo): wall-clock time from the launch to the future's completion. CUDA tensors:
    the GPU's own time, from a CUDA event recorded at the launch to one recorded once the all-reduce
    is done on the stream (an NCCL future completes as soon as the work is queued, so the CPU's clock
    would say nothing); read a step later, when the events have completed, never waited for."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    pending: collections.deque[tuple[Any, Any]] = collections.deque(maxlen=64)

    def settle() -> None:
        while pending and pending[0][1].query():
            start, end = pending.popleft()
            client.waited(start.elapsed_time(end) / 1000.0)

    def hook(state: Any, bucket: Any) -> Any:
        if not bucket.is_last():
            return allreduce_hook(state, bucket)
        if bucket.buffer().is_cuda:
            settle()
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            future = allreduce_hook(state, bucket)

            def recorded(fut: Any) -> Any:
                end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                end.record()  # on the stream the result is ready on: after the all-reduce
                pending.append((start, end))
                return fut.value()

            return future.then(recorded)
        launched = time.monotonic()
        future = allreduce_hook(state, bucket)

        def done(fut: Any) -> Any:
            client.waited(time.monotonic() - launched)
            return fut.value()

        return future.then(done)

    # DDP refuses a hook whose annotations are not the GradBucket and Future classes themselves, and
    # postponed annotations are strings: it gets none.
    hook.__annotations__.clear()
    model.register_comm_hook(process_group, hook)
