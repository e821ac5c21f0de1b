"""The PyTorch checkpoint tier (issue #34): training blocks for a snapshot, the rest runs behind it.

A few lines in a DDP (or FSDP, same world size) loop::

    from ftd.client import Client
    from ftd.client.checkpoint import CheckpointTier, capture_rng

    client = Client()
    tier = CheckpointTier(client, "/local/ckpt", "/shared/ckpt/job42", every_k_flush=10, keep=2)
    for step in range(start, steps):
        train_step()
        client.heartbeat(step)
        if tier.due(step, 500) or client.should_save():  # due: a node lost costs <= 500 steps
            tier.save(step, {"model": model.state_dict(), "optim": opt.state_dict(),
                             "extra": {"step": step, "loader": loader_position, "rng": capture_rng()}})
    tier.close()

:meth:`CheckpointTier.save` copies every tensor of ``state`` into CPU staging buffers kept from one
save to the next (pinned when the tensor is on a GPU; a DTensor's local shard), and returns: that copy
is all training waits for. A background thread then, per save:

1. **local**: probes ``local_dir`` (:func:`ftd.client.levels.probe`: read-only, full, not
   responding), writes ``{local_dir}/step-{step:09d}/rank-{rank:05d}/state.pt`` with ``torch.save``
   (temp file, fsync, rename; SHA-256 computed while writing), writes the manifest last
   (:mod:`ftd.client.manifest`), reports it (``checkpoint`` op, level ``local``) and acks the save
   directives pending when the snapshot was taken, with the manifest's path;
2. **partner**: sends the shard's files to the partner rank over a gloo process group of the tier's
   own (no shared filesystem needed) and receives the shard of the rank it is partner of, written
   under ``{local_dir}/partner/step-.../rank-{src}/`` with its own manifest, level ``partner``,
   reported. The partner is the rank with the same place on the partner node (the coordinator's
   choice, the ``partners`` op; else the next node); on one node, the next rank (protects against a
   lost process, not a lost node). Before each exchange the ranks agree (one small all-gather on the
   tier's group) on the newest choice any of them holds (:func:`agree_partners`), so a choice the
   coordinator changes mid-run applies at the next save, on every rank at once;
3. **shared**: every ``every_k_flush``-th save is copied to ``{shared_dir}/step-.../`` by a second
   thread (a slow or hung shared filesystem delays only that copy; a flush due while the previous one
   still runs is skipped and said), level ``shared``, reported;
4. **retention**: each level keeps the newest ``keep`` complete checkpoints of this rank and never
   deletes the newest one whose manifest verifies (:func:`ftd.client.retention.plan`).

Why its own snapshot rather than ``torch.distributed.checkpoint.async_save``: that stages into new
host memory at every save; on CPU here it blocked 0.56-2.3 s per 1 GB save against 0.10-0.26 s for
buffers reused (docs/checkpoints.md).

Saves never overlap: a ``save`` while the previous one's local write and replication still run
*waits* for them (every rank must take part in every exchange, so skipping on one rank would
desynchronise the pairs); past ``busy_wait_s`` (60 s) the save is skipped and said, later saves are
skipped at once until the stuck one ends, and replication stops for the rest of the run. A level
that cannot take a save is skipped and said; a snapshot that fails is said and skipped; nothing
here raises into training code after construction (construction fails loudly on a bad argument).

Without torch.distributed (one process), the tier writes plain ``torch.save`` files (local and
shared) with no partner level. Resume: :mod:`ftd.client.resume`.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import logging
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ftd.client import Client
from ftd.client import manifest as mf
from ftd.client.environment import env_int
from ftd.client.levels import probe
from ftd.client.retention import plan

__all__ = [
    "STATE_FILE",
    "CheckpointTier",
    "agree_partners",
    "capture_rng",
    "partner_ranks",
    "rank_dir",
    "restore_rng",
    "step_dir",
]

_log = logging.getLogger("ftd.client")
STATE_FILE = "state.pt"
PARTNER = "partner"
_CHUNK = 64 * 1024 * 1024
HISTORY = 256  # saves kept in CheckpointTier.history
LAG_WINDOW = 8  # CheckpointTier.due plans with the slowest landing of this many recent saves


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"step-{step:09d}")


def rank_dir(root: str, step: int, rank: int) -> str:
    return os.path.join(step_dir(root, step), f"rank-{rank:05d}")


def capture_rng() -> dict[str, Any]:
    """The RNG states a resumed job needs to draw the same numbers: torch (CPU and CUDA) and Python's
    ``random`` (tensors and plain values only, so ``torch.load(weights_only=True)`` reads them)."""
    import random

    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": _plain(random.getstate())}
    if _cuda_started():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    import random

    torch.set_rng_state(state["torch"])
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _cuda_started() -> bool:
    return torch.cuda.is_available() and bool(torch.cuda.is_initialized())  # type: ignore[no-untyped-call]


def _plain(obj: Any) -> Any:
    return [_plain(x) for x in obj] if isinstance(obj, tuple) else obj


# --- the snapshot --------------------------------------------------------------------------------


#: With ``overlap``, CPU tensors at least this large are copied behind training, the smaller ones
#: (normalisation statistics, a loss scale: what a forward pass may update in place) at once.
DEFER_MIN_BYTES = 1 << 20

Deferred = list[tuple[torch.Tensor, torch.Tensor]]  # (staging buffer, the tensor to copy into it)


class _Staging:
    """CPU buffers reused from one save to the next, keyed by where a tensor sits in the state."""

    def __init__(self) -> None:
        self.buffers: dict[str, torch.Tensor] = {}
        self.nbytes = 0

    def stage(self, obj: Any, key: str = "", defer: Deferred | None = None) -> Any:
        if isinstance(obj, torch.Tensor):
            return self._tensor(obj, key, defer)
        if isinstance(obj, dict):
            return {k: self.stage(v, f"{key}/{k}", defer) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            staged = [self.stage(v, f"{key}/{i}", defer) for i, v in enumerate(obj)]
            return staged if isinstance(obj, list) else tuple(staged)
        return obj  # ints, floats, strings, None: immutable

    def _tensor(self, t: torch.Tensor, key: str, defer: Deferred | None) -> torch.Tensor:
        local = t.to_local() if hasattr(t, "to_local") else t  # DTensor: this rank's shard
        src = local.detach()
        buf = self.buffers.get(key)
        if buf is None or buf.shape != src.shape or buf.dtype != src.dtype:
            pin = src.device.type == "cuda"
            buf = torch.empty(src.shape, dtype=src.dtype, device="cpu", pin_memory=pin)
            self.buffers[key] = buf
        size = buf.numel() * buf.element_size()
        self.nbytes += size
        if defer is not None and src.device.type == "cpu" and size >= DEFER_MIN_BYTES:
            defer.append((buf, src))  # copied by the background thread before the next optimizer step
            return buf
        buf.copy_(src, non_blocking=src.device.type == "cuda")
        return buf

    def snapshot(self, state: Any, *, overlap: bool = False) -> tuple[Any, int, Deferred]:
        """The staged copy of ``state``, its bytes, and (``overlap``) the large CPU tensors whose copy
        is left for :func:`copy_deferred`: until then the staged structure holds their buffers
        unfilled, and the source tensors must not change."""
        self.nbytes = 0
        defer: Deferred | None = [] if overlap else None
        staged = self.stage(state, defer=defer)
        if _cuda_started():
            torch.cuda.synchronize()  # the non-blocking copies are done before the write reads them
        return staged, self.nbytes, defer or []


def copy_deferred(pending: Deferred) -> None:
    """Fill the staging buffers an overlapped snapshot left (torch's copy runs without the GIL)."""
    for buf, src in pending:
        buf.copy_(src)


# --- files ---------------------------------------------------------------------------------------


class _HashingFile:
    """A file torch.save writes through: size and SHA-256 computed on the way (no second read)."""

    def __init__(self, f: Any) -> None:
        self.f = f
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.sha.update(view)
        self.size += len(view)
        written: int = self.f.write(view)
        return written

    def flush(self) -> None:
        self.f.flush()


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def _write_state(directory: str, staged: Any) -> mf.FileEntry:
    os.makedirs(directory, exist_ok=True)
    target = os.path.join(directory, STATE_FILE)
    tmp = f"{target}.tmp.{os.getpid()}"
    with open(tmp, "wb") as raw:
        out = _HashingFile(raw)
        torch.save(staged, out)  # type: ignore[arg-type]  # a file-like object with write/flush
        raw.flush()
        os.fsync(raw.fileno())
    os.replace(tmp, target)
    _fsync_dir(directory)
    return mf.FileEntry(STATE_FILE, out.size, out.sha.hexdigest())


def _copy_hashing(src: str, dst: str) -> tuple[int, str]:
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    tmp = f"{dst}.tmp.{os.getpid()}"
    sha = hashlib.sha256()
    size = 0
    with open(src, "rb") as fin, open(tmp, "wb") as fout:
        while True:
            chunk = fin.read(_CHUNK)
            if not chunk:
                break
            sha.update(chunk)
            size += len(chunk)
            fout.write(chunk)
        fout.flush()
        os.fsync(fout.fileno())
    os.replace(tmp, dst)
    return size, sha.hexdigest()


def _remove_rank(root: str, step: int, rank: int) -> None:
    shutil.rmtree(rank_dir(root, step, rank), ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(step_dir(root, step), mf.manifest_name(rank)))
    with contextlib.suppress(OSError):
        os.rmdir(step_dir(root, step))  # only when empty (other ranks' files stay)


def steps_in(root: str) -> list[int]:
    """The steps that have a ``step-NNNNNNNNN`` directory under ``root``."""
    try:
        names = os.listdir(root)
    except OSError:
        return []
    steps = []
    for name in names:
        if name.startswith("step-") and name[5:].isdecimal() and len(name) == 14:
            steps.append(int(name[5:]))
    return sorted(steps)


def _retain(root: str, rank: int, keep: int, pinned: set[int]) -> list[int]:
    """Apply :func:`plan` to ``rank``'s checkpoints under ``root``; returns the steps deleted."""
    listed = []
    for step in steps_in(root):
        manifest = os.path.join(step_dir(root, step), mf.manifest_name(rank))
        if not os.path.exists(manifest) and not os.path.isdir(rank_dir(root, step, rank)):
            continue
        m, why = mf.verify(manifest, hashes=False)
        listed.append((step, m is not None and not why and m.rank == rank))
    deleted = [s for s in plan(listed, keep) if s not in pinned]
    for step in deleted:
        _remove_rank(root, step, rank)
    return deleted


# --- the tier ------------------------------------------------------------------------------------


class CheckpointTier:
    """Asynchronous local save, partner replica, shared flush and retention for one rank.

    ``local_dir``: node-local storage (NVMe). ``shared_dir``: the job's shared checkpoint directory
    (None: no shared level). ``every_k_flush``: flush every K-th save to ``shared_dir``. ``keep``:
    complete checkpoints kept per level. ``partner``: replicate to the partner rank (needs an
    initialised torch.distributed; a gloo group of the tier's own is created here, collectively, so
    every rank must construct the tier). ``busy_wait_s``: longest a save waits for the previous
    one's background work before it is skipped. ``transfer_timeout_s``: the tier group's timeout.
    ``generation``: the job's restart count, written in the manifests (default ``$FTD_GENERATION``).
    """

    def __init__(
        self,
        client: Client | None,
        local_dir: str,
        shared_dir: str | None = None,
        *,
        every_k_flush: int = 10,
        keep: int = 2,
        partner: bool = True,
        busy_wait_s: float = 60.0,
        transfer_timeout_s: float = 600.0,
        probe_timeout_s: float = 5.0,
        generation: int | None = None,
        on_done: Callable[[dict[str, Any]], None] | None = None,
        overlap: bool = False,
    ) -> None:
        if every_k_flush < 1 or keep < 1:
            raise ValueError("every_k_flush and keep must be >= 1")
        self.client = client
        self.local_dir = os.path.abspath(local_dir)
        self.shared_dir = os.path.abspath(shared_dir) if shared_dir else None
        self.every_k_flush = every_k_flush
        self.keep = keep
        self.busy_wait_s = busy_wait_s
        self.probe_timeout_s = probe_timeout_s
        self.on_done = on_done
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else (client.rank if client else 0)
        self.world_size = dist.get_world_size() if self.distributed else 1
        self.job = client.job if client else "default"
        self.generation = generation if generation is not None else (env_int("FTD_GENERATION") or 0)
        self._staging = _Staging()
        # Overlapped snapshot: the large CPU tensors are copied by the background thread while the
        # loop goes on; every torch optimizer's step waits for that copy first (a global pre-hook),
        # so the weights and optimizer state are copied before they change. Blocked: the seconds
        # save() took plus the seconds a step waited (``step_waits``).
        self.overlap = overlap
        self._copied = threading.Event()
        self._copied.set()
        self.step_waits: list[float] = []
        self._hook: Any = None
        if overlap:
            from torch.optim.optimizer import register_optimizer_step_pre_hook

            self._hook = register_optimizer_step_pre_hook(self._before_step)
        self._saves = 0
        self._idle = threading.Event()
        self._idle.set()
        self._flush_idle = threading.Event()
        self._flush_idle.set()
        self._pinned: set[int] = set()
        self._stuck = False
        self._lock = threading.Lock()
        #: Why replication stopped (None: it runs). Set once an exchange failed or a save was skipped.
        self.partner_broken: str | None = None
        #: One dict per finished save: step, blocked_s, per-level seconds or the reason it was skipped.
        self.history: list[dict[str, Any]] = []
        self.group: Any = None
        self.send_to: int | None = None
        self.recv_from: list[int] = []
        #: The version of the coordinator's partner choice the pairing uses (-1: none, next node).
        self.partners_version = -1
        self._hosts: list[str] = []
        self._agreed: tuple[int, dict[str, str]] | None = None
        self._sources: set[int] = set()  # every rank this one ever held partner copies of
        # Loss bound (:meth:`due`): the step the loop reported last, the step of the last save taken,
        # the landing lags (steps trained before a save reached the level that survives the node;
        # agreed, the largest over the ranks, one per save), and the lag due() plans with, fixed at
        # each save so every rank plans with the same number.
        self._step_now: int | None = None
        self._last_save_step: int | None = None
        self.landing_lags: list[int] = []
        self._plan_lag = 0
        if partner and self.distributed and self.world_size > 1:
            self.group = dist.new_group(
                backend="gloo", timeout=datetime.timedelta(seconds=transfer_timeout_s)
            )
            hosts: list[Any] = [None] * self.world_size
            dist.all_gather_object(hosts, socket.gethostname(), group=self.group)
            self._hosts = [str(h) for h in hosts]
            self._agree_partners()

    # --- partners ------------------------------------------------------------------------------

    def _agree_partners(self) -> None:
        """Collective on the tier's group, at start and before every save's exchange: every rank
        offers the partner choice it holds (the client's latest ``partners`` op) and all apply the
        same one, the newest any rank has (:func:`agree_partners`), so a choice the coordinator
        changed mid-run (a node got a condition) takes effect at the next save on every rank at
        once, and no rank waits for a partner that pairs by another choice."""
        mine = self.client.partners_choice if self.client is not None else None
        views: list[Any] = [None] * self.world_size
        dist.all_gather_object(views, mine, group=self.group)
        version, choice = agree_partners(views)
        if (version, choice) == self._agreed:
            return
        self._agreed = (version, choice)
        targets = partner_ranks(self._hosts, choice)
        send_to = targets[self.rank]
        recv_from = [src for src, dst in enumerate(targets) if dst == self.rank]
        if self.send_to is not None and (send_to, recv_from) != (self.send_to, self.recv_from):
            _log.info(
                "ftd checkpoint: partner choice %s applied: rank %s now replicates to rank %s "
                "(was %s) and holds copies of %s",
                version,
                self.rank,
                send_to,
                self.send_to,
                recv_from,
            )
        self.partners_version, self.send_to, self.recv_from = version, send_to, recv_from

    # --- save ----------------------------------------------------------------------------------

    def save(self, step: int, state: dict[str, Any]) -> float:
        """Snapshot ``state`` and hand it to the background thread; returns the seconds training was
        blocked (waiting for the previous save included). Every rank saves the same steps."""
        t0 = time.perf_counter()
        # a save asked for, taken or skipped: due() counts the next interval from here (a skipped one
        # is not asked again at every step while the stuck save lasts)
        self._last_save_step = step
        self._step_now = step
        # Waited once in vain: the earlier save is stuck (a partner or a disk not answering); later
        # saves are skipped at once until it ends, instead of blocking training again and again.
        if not self._idle.wait(0.0 if self._stuck else self.busy_wait_s):
            self._stuck = True
            reason = f"the save of an earlier step still runs after {self.busy_wait_s:g}s"
            _log.warning("ftd checkpoint: step %s skipped: %s", step, reason)
            self.partner_broken = self.partner_broken or f"a save was skipped ({reason})"
            self._record({"step": step, "skipped": reason})
            return time.perf_counter() - t0
        self._stuck = False
        self._idle.clear()
        try:
            staged, nbytes, pending = self._staging.snapshot(state, overlap=self.overlap)
            if pending:
                self._copied.clear()
            ids = self.client.take_pending_saves() if self.client is not None else []
        except Exception as exc:  # fail-open: said, the save skipped, pending saves left pending
            self._idle.set()
            _log.warning("ftd checkpoint: step %s skipped: the snapshot failed: %s", step, exc, exc_info=True)
            self._record({"step": step, "skipped": f"the snapshot failed: {exc}"})
            return time.perf_counter() - t0
        except BaseException:
            self._idle.set()
            raise
        blocked = time.perf_counter() - t0
        self._saves += 1
        # the previous save's background work is over (waited for above), so the agreed lags are the
        # same on every rank here: the plan until the next save
        self._plan_lag = max(self.landing_lags[-LAG_WINDOW:], default=0)
        flush = self.shared_dir is not None and self._saves % self.every_k_flush == 0
        threading.Thread(
            target=self._background,
            args=(step, staged, nbytes, ids, blocked, flush, pending),
            name=f"ftd-ckpt-{step}",
            daemon=True,
        ).start()
        return blocked

    def due(self, step: int, every: int) -> bool:
        """Whether to save at ``step`` so that losing this node without warning costs at most
        ``every`` steps: call it once per step, after the step (``if tier.due(step, 500) or
        client.should_save(): tier.save(...)``).

        A save is not safe from the node's loss until it reaches the partner (with no partner level:
        until it is on local disk); a node killed between a save's snapshot and that moment resumes
        from the save before. Saving every ``every`` steps would then lose ``every`` plus the steps
        trained while the save was in flight. So saves come every ``every - lag - 1`` steps (at least
        1), where ``lag`` is the most steps any rank trained between a save's snapshot and its
        landing, over the last :data:`LAG_WINDOW` saves (agreed by every rank at each save, so every
        rank saves the same steps; without the tier's group in a distributed job there is no
        agreement and the plain ``step % every`` is used). The first save is at a multiple of
        ``every``. The bound holds while a save lands no slower than the slowest of the recent ones;
        ``landing_lags`` has the measured lags, ``history`` each save's ``landed_steps``.
        """
        if every < 1:
            raise ValueError("every must be >= 1")
        self._step_now = step
        if self._last_save_step is None or (self.distributed and self.group is None):
            return step % every == 0
        return step - self._last_save_step >= max(1, every - self._plan_lag - 1)

    def _note_lag(self, lag: int) -> None:
        self.landing_lags.append(max(0, lag))
        del self.landing_lags[:-HISTORY]

    def _record(self, record: dict[str, Any]) -> None:
        with self._lock:
            self.history.append(record)
            del self.history[:-HISTORY]

    def prepare(self, state: dict[str, Any]) -> None:
        """Allocate the staging buffers for ``state`` now (before the loop): the first save then
        blocks only for the copy (allocating and touching 1 GB of host memory costs more than the
        copy itself). Writes nothing."""
        self._idle.wait()
        self._staging.snapshot(state)  # every buffer allocated and filled now, none deferred

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Every torch optimizer's step pre-hook (``overlap``): wait until the snapshot's copy is done."""
        if not self._copied.is_set():
            t0 = time.perf_counter()
            self._copied.wait()
            self.step_waits.append(time.perf_counter() - t0)
            del self.step_waits[:-HISTORY]

    def wait_snapshot(self, timeout: float | None = None) -> bool:
        """``overlap`` in a loop that changes the saved tensors other than through a torch optimizer's
        ``step`` (a hand-written update, weights loaded in place): call this before changing them."""
        return self._copied.wait(timeout)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the background work (local, partner and shared); True when all of it is done."""
        deadline = None if timeout is None else time.monotonic() + timeout
        ok = self._idle.wait(timeout)
        rest = None if deadline is None else max(0.0, deadline - time.monotonic())
        return ok and self._flush_idle.wait(rest)

    def close(self, timeout: float | None = None) -> None:
        self.wait(timeout)
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    # --- background ----------------------------------------------------------------------------

    def _background(
        self,
        step: int,
        staged: Any,
        nbytes: int,
        ids: list[str],
        blocked: float,
        flush: bool,
        pending: Deferred | None = None,
    ) -> None:
        record: dict[str, Any] = {"step": step, "blocked_s": blocked, "bytes": nbytes}
        try:
            if pending:
                t0 = time.perf_counter()
                try:
                    copy_deferred(pending)
                finally:
                    self._copied.set()  # a failed copy is said below; training never waits forever
                record["copy_s"] = time.perf_counter() - t0
                del pending
            local_manifest = self._save_local(step, staged, nbytes, ids, record)
            del staged
            if self.group is not None and self.partner_broken is None:
                self._replicate(step, local_manifest, record)
                if self.partner_broken is None:
                    self._landing(step, local_manifest, record)
            elif self.group is None:
                self._landing(step, local_manifest, record)
            if flush and local_manifest is not None:
                self._start_flush(step, local_manifest, record)
            with self._lock:
                pinned = set(self._pinned)
            _retain(self.local_dir, self.rank, self.keep, pinned)
        except BaseException as exc:  # a thread's failure is said, never raised into training
            _log.warning("ftd checkpoint: step %s: %s", step, exc, exc_info=True)
            record["error"] = str(exc)
        finally:
            self._record(record)
            self._idle.set()
            if self.on_done is not None:
                self.on_done(record)

    def _landing(self, step: int, local_manifest: str | None, record: dict[str, Any]) -> None:
        """Steps the loop trained (as :meth:`due` saw them) between this save's snapshot and its
        landing where a node's loss cannot take it: at the partner when the tier has its group
        (agreed: every rank gathers every rank's lag and keeps the largest, so every rank plans the
        same saves), else on local disk. A save that did not land there adds no lag."""
        if self.group is not None:
            mine = None
            if record.get("partner_s") is not None and self._step_now is not None:
                mine = max(0, self._step_now - step)
            lags: list[Any] = [None] * self.world_size
            # collective, like the exchange before it: every rank whose exchange completed gets here
            dist.all_gather_object(lags, mine, group=self.group)
            known = [lag for lag in lags if isinstance(lag, int)]
            if known:
                record["landed_steps"] = max(known)
                self._note_lag(max(known))
            return
        if local_manifest is not None and self._step_now is not None:
            record["landed_steps"] = max(0, self._step_now - step)
            self._note_lag(record["landed_steps"])

    def _manifest(self, directory: str, step: int, rank: int, level: str, save_s: float, files: Any) -> str:
        return mf.write(
            directory,
            mf.Manifest(
                job=self.job,
                step=step,
                rank=rank,
                world_size=self.world_size,
                generation=self.generation,
                level=level,
                created=time.time(),
                save_s=save_s,
                files=tuple(files),
            ),
        )

    def _report(
        self, step: int, manifest: str, level: str, save_s: float, nbytes: int, ids: list[str]
    ) -> None:
        if self.client is None:
            return
        for did in ids or [""]:
            self.client.report_checkpoint(
                step, manifest, save_s=save_s, level=level, directive_id=did, world_size=self.world_size
            )

    def _save_local(
        self, step: int, staged: Any, nbytes: int, ids: list[str], record: dict[str, Any]
    ) -> str | None:
        t0 = time.perf_counter()
        why = probe(self.local_dir, need=nbytes, timeout_s=self.probe_timeout_s)
        if why:
            return self._local_failed(step, ids, record, f"local level skipped: {why}")
        try:
            entry = _write_state(rank_dir(self.local_dir, step, self.rank), staged)
            rel = mf.FileEntry(f"rank-{self.rank:05d}/{STATE_FILE}", entry.size, entry.sha256)
            save_s = time.perf_counter() - t0
            # the level's save time, as a deadline needs it: from the loop's save call (the snapshot,
            # which blocked it) until this level holds the checkpoint
            held_s = record["blocked_s"] + save_s
            manifest = self._manifest(step_dir(self.local_dir, step), step, self.rank, "local", held_s, [rel])
        except Exception as exc:  # a disk error, or a state torch.save cannot pickle: said and nacked
            return self._local_failed(step, ids, record, f"local save failed: {exc}")
        record["local_s"] = save_s
        self._report(step, manifest, "local", held_s, entry.size, ids)
        if self.client is not None and ids:
            self.client.answer_taken(ids, ok=True, step=step, path=manifest)
        return manifest

    def _local_failed(self, step: int, ids: list[str], record: dict[str, Any], reason: str) -> str | None:
        _log.warning("ftd checkpoint: step %s: %s", step, reason)
        record["local"] = reason
        if self.client is not None and ids:
            self.client.answer_taken(ids, ok=False, step=step, path=None, reason=reason)
        return None

    # --- partner -------------------------------------------------------------------------------

    def _replicate(self, step: int, local_manifest: str | None, record: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        try:
            self._agree_partners()
        except Exception as exc:
            self.partner_broken = f"agreeing on the partners before step {step} failed: {exc}"
            _log.warning("ftd checkpoint: partner level stopped: %s", self.partner_broken)
            record["partner"] = self.partner_broken
            return
        record["partners_version"] = self.partners_version
        record["send_to"] = self.send_to
        files: list[tuple[str, str, int, str]] = []  # (relative path, full path, size, sha256)
        if local_manifest is not None:
            m = mf.read(local_manifest)
            base = os.path.dirname(local_manifest)
            files = [(f.path, os.path.join(base, f.path), f.size, f.sha256) for f in m.files]
        root = os.path.join(self.local_dir, PARTNER)
        why = probe(root, timeout_s=self.probe_timeout_s) if self.recv_from else ""
        try:
            received = exchange(self.group, step, files, self.send_to, self.recv_from, root, accept=not why)
        except Exception as exc:
            self.partner_broken = f"the exchange of step {step} failed: {exc}"
            _log.warning("ftd checkpoint: partner level stopped: %s", self.partner_broken)
            record["partner"] = self.partner_broken
            return
        if why:
            record["partner"] = f"partner level skipped: {why}"
            _log.warning("ftd checkpoint: step %s: %s", step, record["partner"])
            return
        save_s = time.perf_counter() - t0
        # from the partner's save call until this node holds its copy (its snapshot and local write
        # are its own: this rank's stand in for them, the ranks save the same step together)
        held_s = record.get("blocked_s", 0.0) + record.get("local_s", 0.0) + save_s
        for src, entries in received.items():
            if entries is None:
                continue
            manifest = self._manifest(step_dir(root, step), step, src, "partner", held_s, entries)
            self._report(step, manifest, "partner", held_s, sum(e.size for e in entries), [])
            self._sources.add(src)
        with self._lock:
            pinned = set(self._pinned)
        # Also the ranks it held copies of under an earlier pairing: theirs age out as its own do
        # (the newest verified copy is kept, so a copy that is still the only one of a step stays).
        for src in sorted(self._sources):
            _retain(root, src, self.keep, pinned)
        record["partner_s"] = save_s

    # --- shared --------------------------------------------------------------------------------

    def _start_flush(self, step: int, local_manifest: str, record: dict[str, Any]) -> None:
        if not self._flush_idle.is_set():
            record["shared"] = "shared flush skipped: the previous flush still runs"
            _log.warning("ftd checkpoint: step %s: %s", step, record["shared"])
            return
        self._flush_idle.clear()
        with self._lock:
            self._pinned.add(step)
        threading.Thread(
            target=self._flush, args=(step, local_manifest, record), name=f"ftd-flush-{step}", daemon=True
        ).start()

    def _flush(self, step: int, local_manifest: str, record: dict[str, Any]) -> None:
        assert self.shared_dir is not None
        t0 = time.perf_counter()
        try:
            m = mf.read(local_manifest)
            need = sum(f.size for f in m.files)
            why = probe(self.shared_dir, need=need, timeout_s=self.probe_timeout_s)
            if why:
                record["shared"] = f"shared level skipped: {why}"
                _log.warning("ftd checkpoint: step %s: %s", step, record["shared"])
                return
            src_base = os.path.dirname(local_manifest)
            dst_base = step_dir(self.shared_dir, step)
            entries = []
            for f in m.files:
                size, sha = _copy_hashing(os.path.join(src_base, f.path), os.path.join(dst_base, f.path))
                if size != f.size or sha != f.sha256:
                    raise OSError(f"{f.path} changed while it was copied (local copy corrupt?)")
                entries.append(mf.FileEntry(f.path, size, sha))
            _fsync_dir(os.path.join(dst_base, f"rank-{self.rank:05d}"))
            save_s = time.perf_counter() - t0
            manifest = self._manifest(dst_base, step, self.rank, "shared", save_s, entries)
            record["shared_s"] = save_s
            self._report(step, manifest, "shared", save_s, need, [])
            _retain(self.shared_dir, self.rank, self.keep, set())
        except Exception as exc:
            record["shared"] = f"shared flush failed: {exc}"
            _log.warning("ftd checkpoint: step %s: %s", step, record["shared"])
        finally:
            with self._lock:
                self._pinned.discard(step)
            self._flush_idle.set()


def agree_partners(views: list[Any]) -> tuple[int, dict[str, str]]:
    """The partner choice every rank applies, from each rank's view (``views[rank]``: the
    ``(version, partners)`` it holds, or None): the one with the greatest version, the lowest rank's
    among equals; ``(-1, {})`` when no rank holds one (the next node, :func:`partner_ranks`). The
    views are gathered, so every rank computes the same answer from the same list, including the
    ranks whose agent has not sent them that choice yet (the gather hands it to them). A view that is
    not a ``(version, dict)`` pair is ignored."""
    best: tuple[int, dict[str, str]] = (-1, {})
    for view in views:
        if not isinstance(view, (tuple, list)) or len(view) != 2:
            continue
        version, choice = view
        if not isinstance(version, int) or isinstance(version, bool) or not isinstance(choice, dict):
            continue
        if version > best[0]:
            best = (version, {str(k): str(v) for k, v in choice.items()})
    return best


def partner_ranks(hosts: list[str], partners: dict[str, str]) -> list[int | None]:
    """For each rank (``hosts[rank]`` its node), the rank it replicates to: the rank with the same
    place on the partner node (``partners[node]``, else the next node in rank order); with one node,
    the next rank. None: nowhere (a world of one)."""
    world = len(hosts)
    if world < 2:
        return [None] * world
    nodes: list[str] = []
    members: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        if host not in members:
            nodes.append(host)
            members[host] = []
        members[host].append(rank)
    if len(nodes) == 1:
        return [(r + 1) % world for r in range(world)]
    out: list[int | None] = []
    for rank, host in enumerate(hosts):
        target = partners.get(host)
        if target not in members or target == host:
            target = nodes[(nodes.index(host) + 1) % len(nodes)]
        place = members[host].index(rank)
        peers = members[target]
        out.append(peers[place % len(peers)])
    return out


# --- moving a shard's files between ranks (gloo, no shared filesystem) ---------------------------


class _Sender:
    def __init__(self, files: list[tuple[str, int]]) -> None:
        self.files = files  # (full path, size)
        self.index = 0
        self.handle: Any = None
        self.left = sum(size for _, size in files)

    def chunk(self) -> torch.Tensor | None:
        if self.left <= 0:
            return None
        want = min(self.left, _CHUNK)
        data = bytearray()
        while len(data) < want and self.index < len(self.files):
            path, _size = self.files[self.index]
            if self.handle is None:
                self.handle = open(path, "rb")  # noqa: SIM115 (closed when the file is done)
            piece = self.handle.read(want - len(data))
            if not piece:
                self.handle.close()
                self.handle = None
                self.index += 1
                continue
            data += piece
        if len(data) < want:  # a file shrank since its manifest: pad; the receiver's hash check refuses it
            data += bytearray(want - len(data))
        self.left -= want
        return torch.frombuffer(data, dtype=torch.uint8)


class _Receiver:
    def __init__(self, root: str, entries: list[dict[str, Any]], accept: bool) -> None:
        self.root = root
        self.entries = entries
        self.accept = accept
        self.index = 0
        self.handle: Any = None
        self.sha = hashlib.sha256()
        self.got = 0
        self.left = sum(int(e["size"]) for e in entries)
        self.done: list[mf.FileEntry] = []
        self.ok = True

    def take(self, data: memoryview) -> None:
        self.left -= len(data)
        pos = 0
        while pos < len(data):
            e = self.entries[self.index]
            size = int(e["size"])
            if self.handle is None and self.accept:
                path = os.path.join(self.root, e["path"])
                os.makedirs(os.path.dirname(path), exist_ok=True)
                self.handle = open(f"{path}.tmp.{os.getpid()}", "wb")  # noqa: SIM115
            n = min(size - self.got, len(data) - pos)
            piece = data[pos : pos + n]
            self.sha.update(piece)
            if self.handle is not None:
                self.handle.write(piece)
            self.got += n
            pos += n
            if self.got == size:
                self._finish(e)
        while self.index < len(self.entries) and int(self.entries[self.index]["size"]) == 0:
            self._finish(self.entries[self.index])

    def _finish(self, e: dict[str, Any]) -> None:
        if self.handle is None and self.accept:  # an empty file
            path = os.path.join(self.root, e["path"])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self.handle = open(f"{path}.tmp.{os.getpid()}", "wb")  # noqa: SIM115
        digest = self.sha.hexdigest()
        if self.handle is not None:
            self.handle.flush()
            os.fsync(self.handle.fileno())
            self.handle.close()
            self.handle = None
            path = os.path.join(self.root, e["path"])
            if digest == e["sha256"]:
                os.replace(f"{path}.tmp.{os.getpid()}", path)
                self.done.append(mf.FileEntry(e["path"], int(e["size"]), digest))
            else:
                os.unlink(f"{path}.tmp.{os.getpid()}")
                self.ok = False
        self.sha = hashlib.sha256()
        self.got = 0
        self.index += 1


def exchange(
    group: Any,
    step: int,
    files: list[tuple[str, str, int, str]],
    send_to: int | None,
    recv_from: list[int],
    root: str,
    *,
    accept: bool = True,
) -> dict[int, list[mf.FileEntry] | None]:
    """Send ``files`` (relative path, full path, size, sha256) to rank ``send_to`` and receive the
    files of every rank in ``recv_from``, written under ``step_dir(root, step)``; both sides of every
    pair call this for the same step. Returns, per source rank, the received entries (each checked
    against its sender's SHA-256) or None when that rank sent nothing whole."""
    meta = json.dumps(
        {"step": step, "files": [{"path": p, "size": s, "sha256": h} for p, _, s, h in files]}
    ).encode()
    pending = []
    lengths = {src: torch.zeros(1, dtype=torch.int64) for src in recv_from}
    if send_to is not None:
        pending.append(dist.isend(torch.tensor([len(meta)], dtype=torch.int64), send_to, group=group))
    pending += [dist.irecv(t, src, group=group) for src, t in lengths.items()]
    for w in pending:
        if w is not None:
            w.wait()
    metas = {src: torch.empty(int(t.item()), dtype=torch.uint8) for src, t in lengths.items()}
    pending = []
    if send_to is not None:
        pending.append(dist.isend(torch.frombuffer(bytearray(meta), dtype=torch.uint8), send_to, group=group))
    pending += [dist.irecv(t, src, group=group) for src, t in metas.items()]
    for w in pending:
        if w is not None:
            w.wait()
    receivers: dict[int, _Receiver] = {}
    for src, t in metas.items():
        info = json.loads(bytes(t.numpy()) if t.numel() else b"{}")
        entries = info.get("files", []) if info.get("step") == step else []
        for e in entries:
            mf._relative(e.get("path"), f"rank {src}'s shard")
        receivers[src] = _Receiver(step_dir(root, step), entries, accept and info.get("step") == step)
    sender = _Sender([(full, size) for _, full, size, _ in files]) if send_to is not None else None
    while (sender is not None and sender.left > 0) or any(r.left > 0 for r in receivers.values()):
        pending = []
        if sender is not None:
            chunk = sender.chunk()
            if chunk is not None:
                pending.append(dist.isend(chunk, send_to, group=group))
        bufs = {}
        for src, r in receivers.items():
            if r.left > 0:
                bufs[src] = torch.empty(min(r.left, _CHUNK), dtype=torch.uint8)
                pending.append(dist.irecv(bufs[src], src, group=group))
        for w in pending:
            if w is not None:
                w.wait()
        for src, buf in bufs.items():
            receivers[src].take(memoryview(buf.numpy()).cast("B"))  # type: ignore[arg-type]
    out: dict[int, list[mf.FileEntry] | None] = {}
    for src, r in receivers.items():
        whole = r.ok and r.accept and len(r.done) == len(r.entries) and bool(r.entries)
        out[src] = r.done if whole else None
    return out
