"""The DDP training job of ``ftd bench recovery`` and the recovery tests: one rank, torch gloo on CPU.

Run by ``ftd run`` (one supervisor per node) as ``python recovery_trainer.py``: the supervisor gives
it torchrun's environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``...) plus
``FTD_GENERATION``, ``FTD_RUN``, ``FTD_JOB_ID`` and, after a restart, ``FTD_RESUME_STEP``. The
same file runs under ``torchrun --max-restarts`` (the peer ``ftd bench recovery`` compares with):
there its generation is the highest ``TORCHELASTIC_RESTART_COUNT`` of the ranks of its rendezvous
(each node's elastic agent counts its own restarts; the highest names the round the same way on
every rank). It is the user's side of recovery, written the way the docs tell users to:

- **resume**: from the checkpoint of ``FTD_RESUME_STEP`` when given (the step every rank saved),
  else from the newest complete checkpoint in the shared directory (a scheduler requeue);
- **save and stop on the same step everywhere**: :class:`ftd.client.torch.TorchCoordinator`
  all-reduces the client's save/stop flags each step; rank 0 writes the checkpoint (temp file,
  ``os.replace``), every rank acks after a barrier, so a spare that takes slot i loads what rank i
  trained;
- **never mixes generations**: right after ``init_process_group`` every rank all-gathers its
  ``FTD_GENERATION`` and records whether all of them are its own (the rendezvous port moves with
  the generation, so this must always hold: the bench counts the ranks for which it does not).

What it records (the bench's and tests' only source for the ranks' side): one JSON line per event
in ``$FTD_RECOVERY_DIR/log/<job>-g<generation>-r<rank>-<pid>.jsonl`` (one file per process, no
interleaving), each with ``what``, ``t`` (wall clock), ``job``, ``rank``, ``generation``, ``run``,
``restart`` (``SLURM_RESTART_COUNT``), ``node`` and ``pid``: ``process_start`` (``warm``: a
pre-started interpreter; ``ppid``: its supervisor), ``rendezvous`` (``generations`` gathered,
``same``), ``resumed`` (``step``: the checkpoint it starts from, 0 for none; ``asked``:
``FTD_RESUME_STEP``), ``step`` (every step), ``saved`` (step, path; ``periodic``: one of the
checkpoints taken every ``$FTD_RECOVERY_SAVE_EVERY`` steps, none by default, recorded by rank 0 as
soon as it is on disk, by the others after the barrier that follows), ``stopped``, ``exit``
(``outcome``). Knobs:
``$FTD_RECOVERY_STEP_S`` (seconds slept per step, 0.1), ``$FTD_RECOVERY_MAX_S`` (give up and exit 1
after this long, 900), ``$FTD_RECOVERY_STEPS`` (the training is done at this step: every rank exits
0 there, outcome ``done``; unset: it trains until stopped), ``$FTD_RECOVERY_BLOCK_FIFO`` with
``$FTD_RECOVERY_BLOCK_AT`` (generation 0 only: every rank blocks at that step opening that FIFO for
reading, which nobody writes -- a job-wide hang, a shared file system that stopped answering; recorded
as ``blocking``).

With ``$FTD_RECOVERY_TIER=1`` (the checkpoint bench's fault cases, issue #34) it saves through the
checkpoint tier instead (:class:`ftd.client.checkpoint.CheckpointTier`: a snapshot, then the local
write under ``$FTD_RECOVERY_DIR/local/<node>``, the partner replica and every
``$FTD_RECOVERY_FLUSH_EVERY``-th save flushed to the shared ``<job>-ckpt``) and resumes with
:func:`ftd.client.resume.load_resume` (``FTD_RESUME_*`` when the restart set them, else the newest
step every rank can get); ``$FTD_RECOVERY_STATE_MB`` adds that much state (a tensor saved with the
model) so a save's background work takes a while. It records ``resumed`` with the ``level`` each
rank loaded from (or ``resume_failed`` with the reason), ``save_started`` when a save's snapshot is
taken and ``tier_done`` when its local write and replica are done (``detail``: the tier's record).

For ``ftd bench culprit`` (issue #33), two more knobs: ``$FTD_RECOVERY_TIME_COLLECTIVES=1`` times the
gradients' all-reduce with the torch helper's DDP hook (:func:`ftd.client.torch.time_collectives`: the
step timing slow-rank detection reads), and ``$FTD_RECOVERY_FAULT_DIR``: before each step the rank
looks for ``<dir>/<its pid>.json`` (the bench writes it; a new process never finds its predecessor's),
``{"fault": "stuck"}`` (it sleeps forever before its next forward pass and all-reduce), ``{"fault":
"fifo", "path": P}`` (it opens the FIFO ``P``, which nobody writes: blocked in ``open``) or ``{"fault":
"slow", "sleep_s": S}`` (``S`` more seconds slept per step from then on, before the forward pass: the
other ranks then wait for it in the timed all-reduce); each recorded once as
``fault``. ``$FTD_RECOVERY_BUSY_S`` (0 by default) is CPU seconds of computation per step (matrix
products on the rank's own thread until its CPU time advanced that much, before the forward pass): a
step bound by the CPU, which a CPU quota on the rank's cgroup then slows (the ``throttled`` case).
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

_STARTED = time.time()


class Recorder:
    """Appends this process's JSON lines (see the module docstring)."""

    def __init__(self, out: Path, base: dict[str, Any]) -> None:
        out.mkdir(parents=True, exist_ok=True)
        name = f"{base['job']}-g{base['generation']}-r{base['rank']}-{base['pid']}.jsonl"
        self.path = out / name
        self.base = base

    def __call__(self, what: str, *, t: float | None = None, **fields: Any) -> None:
        line = {"what": what, "t": time.time() if t is None else t, **self.base, **fields}
        with self.path.open("a") as f:
            f.write(json.dumps(line) + "\n")


def checkpoint_path(ckpt: Path, step: int) -> Path:
    return ckpt / f"step-{step:08d}.pt"


def newest_checkpoint(ckpt: Path) -> int:
    """The newest step with a complete checkpoint (written by rename, so present means complete)."""
    steps = [int(p.stem.split("-")[1]) for p in ckpt.glob("step-*.pt")]
    return max(steps, default=0)


def stuck_before_collective() -> None:
    """The ``stuck`` fault: never returns (py-spy shows this frame above the training loop)."""
    while True:
        time.sleep(3600)


def read_never_answering_path(path: str) -> None:
    """The ``fifo`` fault: blocks in ``open`` of a FIFO nobody writes (a job-wide stall)."""
    with open(path, "rb") as f:
        f.read()


def busy(cpu_s: float) -> None:
    """Compute on this thread until its CPU time advanced ``cpu_s`` (``$FTD_RECOVERY_BUSY_S``)."""
    import torch

    a = torch.randn(64, 64)
    until = time.thread_time() + cpu_s
    while time.thread_time() < until:
        a = torch.tanh(a @ a)


def injected_fault(fault_dir: str, record: Recorder, seen: dict[str, Any]) -> float:
    """Apply the fault the bench asked of this process (module docstring); the extra seconds to sleep
    per step."""
    if "fault" not in seen:
        path = Path(fault_dir) / f"{os.getpid()}.json"
        if not path.exists():
            return 0.0
        try:
            seen["fault"] = json.loads(path.read_text())
        except ValueError:
            return 0.0  # being written: the next step reads it
        record("fault", **seen["fault"])
    fault = seen["fault"]
    if fault.get("fault") == "stuck":
        stuck_before_collective()
    elif fault.get("fault") == "fifo":
        read_never_answering_path(str(fault["path"]))
    elif fault.get("fault") == "slow":
        return float(fault.get("sleep_s", 0.0))
    return 0.0


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw.lstrip("-").isdecimal() else None


def main() -> int:
    out = Path(os.environ["FTD_RECOVERY_DIR"])
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    elastic = "FTD_GENERATION" not in os.environ and "TORCHELASTIC_RESTART_COUNT" in os.environ
    own = int(os.environ.get("FTD_GENERATION") or os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)
    job = os.environ.get("FTD_JOB_ID") or os.environ.get("SLURM_JOB_ID") or "job"
    step_s = float(os.environ.get("FTD_RECOVERY_STEP_S", "0.1"))
    save_every = _env_int("FTD_RECOVERY_SAVE_EVERY") or 0
    give_up = time.monotonic() + float(os.environ.get("FTD_RECOVERY_MAX_S", "900"))

    def recorder(generation: int) -> Recorder:
        base = {
            "job": job,
            "rank": rank,
            "generation": generation,
            "run": os.environ.get("FTD_RUN"),
            "restart": int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0),
            "node": os.environ.get("SLURMD_NODENAME", "?"),
            "pid": os.getpid(),
        }
        return Recorder(out / "log", base)

    warm_at = os.environ.get("FTD_WARM_READY_AT")
    record = recorder(own)
    if not elastic:  # under torchrun the generation is known after the rendezvous (below)
        record("process_start", t=_STARTED, warm=warm_at is not None, ppid=os.getppid())

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from ftd.client import Client
    from ftd.client.torch import TorchCoordinator

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))  # env://: MASTER_ADDR/PORT, RANK
    gens = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(gens, torch.tensor([own], dtype=torch.int64))
    gathered = [int(g.item()) for g in gens]
    generation = own
    if elastic:  # every rank of this rendezvous round names it by the highest restart count
        generation = max(gathered)
        record = recorder(generation)
        record("process_start", t=_STARTED, warm=False, ppid=os.getppid(), restart_count=own)
        record("rendezvous", generations=gathered, same=True)  # a new round gathers every rank anew
    else:
        record("rendezvous", generations=gathered, same=all(g == generation for g in gathered))

    torch.manual_seed(0)
    model = torch.nn.Linear(32, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ckpt = out / f"{job}-ckpt"
    ckpt.mkdir(parents=True, exist_ok=True)
    asked = _env_int("FTD_RESUME_STEP")
    client = Client()  # job from FTD_JOB, rank from RANK, run from FTD_RUN, socket from FTD_SOCKET
    tier = None
    if os.environ.get("FTD_RECOVERY_TIER") == "1":
        tier, start = _tier_resume(out, ckpt, model, opt, client, record, asked)
        if tier is None:
            client.close()
            dist.destroy_process_group()
            return 1
    else:
        start = asked if asked is not None else newest_checkpoint(ckpt)
        if start and not checkpoint_path(ckpt, start).exists():
            record("resume_missing", step=start)  # the agreed step has no checkpoint: the newest one
            start = newest_checkpoint(ckpt)
        if start:
            state = torch.load(checkpoint_path(ckpt, start), weights_only=True)
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
        record("resumed", step=start, asked=asked)
    net = DistributedDataParallel(model)

    if os.environ.get("FTD_RECOVERY_TIME_COLLECTIVES") == "1":
        from ftd.client.torch import time_collectives

        time_collectives(net, client)
    coord = TorchCoordinator(client)
    fault_dir = os.environ.get("FTD_RECOVERY_FAULT_DIR", "")
    fault_seen: dict[str, Any] = {}
    outcome, step = "timeout", start
    last_step = _env_int("FTD_RECOVERY_STEPS")
    block_fifo, block_at = os.environ.get("FTD_RECOVERY_BLOCK_FIFO", ""), _env_int("FTD_RECOVERY_BLOCK_AT")
    busy_s = float(os.environ.get("FTD_RECOVERY_BUSY_S", "0") or 0)
    while time.monotonic() < give_up:
        if last_step is not None and step >= last_step:
            outcome = "done"
            break
        extra_s = injected_fault(fault_dir, record, fault_seen) if fault_dir else 0.0
        if extra_s:  # before the forward pass (data loading): the others wait in the gradients' all-reduce
            time.sleep(extra_s)
        if busy_s > 0:
            busy(busy_s)
        step += 1
        if block_fifo and generation == 0 and step == block_at:
            record("blocking", step=step, fifo=block_fifo)
            with open(block_fifo, "rb") as blocked:  # nobody writes it: blocks here, on every rank
                blocked.read(1)
        gen = torch.Generator().manual_seed(step * 1000 + rank)
        loss = net(torch.randn(16, 32, generator=gen)).pow(2).mean()
        opt.zero_grad()
        loss.backward()  # the gradients' all-reduce: every rank of the generation takes part
        opt.step()
        if step_s:
            time.sleep(step_s)
        record("step", step=step, loss=round(float(loss.item()), 6))
        client.heartbeat(step)
        save, stop = coord.agree(step)
        if tier is not None and save_every:  # planned so a node lost mid-save costs <= save_every steps
            periodic = tier.due(step, save_every) and not save
        else:
            periodic = bool(save_every) and step % save_every == 0 and not save
        if tier is not None and (save or periodic):
            blocked = tier.save(step, _tier_state(model, opt, step))
            record("save_started", step=step, blocked_s=round(blocked, 6), periodic=periodic)
            if save:  # asked by the coordinator: on disk before the ack
                tier.wait(120)
                from ftd.client.checkpoint import step_dir

                coord.saved(step, step_dir(tier.local_dir, step))
                record("saved", step=step, path=step_dir(tier.local_dir, step))
        elif save or periodic:
            path = checkpoint_path(ckpt, step)
            if rank == 0:
                tmp = path.with_suffix(".tmp")
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
                os.replace(tmp, path)
                if periodic:  # on disk now, whether or not the barrier below completes (a rank killed)
                    record("saved", step=step, path=str(path), periodic=True)
            dist.barrier()  # complete on disk before any rank acks or records it
            if save:
                coord.saved(step, str(path))
                record("saved", step=step, path=str(path))
            elif rank != 0:
                record("saved", step=step, path=str(path), periodic=True)
        if stop:
            outcome = "stopped"
            record("stopped", step=step)
            break
    if tier is not None:
        tier.close(60)
    client.close()
    record("exit", step=step, outcome=outcome)
    del net  # DDP's reducer holds the process group
    dist.destroy_process_group()
    return 0 if outcome in ("stopped", "done") else 1


_PAD: dict[str, Any] = {}


def _tier_state(model: Any, opt: Any, step: int) -> dict[str, Any]:
    return {"model": model.state_dict(), "optim": opt.state_dict(), "extra": {"step": step, **_PAD}}


def _tier_resume(
    out: Path, shared: Path, model: Any, opt: Any, client: Any, record: Recorder, asked: int | None
) -> tuple[Any, int]:
    """Resume with the checkpoint tier and start it (collective: every rank); (None, 0) when the
    resume failed (recorded)."""
    import torch

    from ftd.client.checkpoint import CheckpointTier
    from ftd.client.resume import load_resume

    mb = float(os.environ.get("FTD_RECOVERY_STATE_MB", "0") or 0)
    if mb > 0:
        _PAD["pad"] = torch.randn(int(mb * 2**20) // 4)
    local = out / "local" / os.environ.get("SLURMD_NODENAME", "node")
    try:
        resumed = load_resume(str(local), str(shared))
    except RuntimeError as exc:
        record("resume_failed", why=str(exc)[:2000], asked=asked)
        return None, 0
    start = 0
    if resumed is not None:
        model.load_state_dict(resumed.state["model"])
        opt.load_state_dict(resumed.state["optim"])
        start = resumed.step
    record(
        "resumed",
        step=start,
        asked=asked,
        level=resumed.level if resumed else None,
        manifest=resumed.manifest if resumed else None,
        env_level=os.environ.get("FTD_RESUME_LEVEL"),
    )

    def done(detail: dict[str, Any]) -> None:
        record("tier_done", step=detail.get("step"), detail=json.loads(json.dumps(detail, default=str)))

    flush = _env_int("FTD_RECOVERY_FLUSH_EVERY") or 10
    tier = CheckpointTier(client, str(local), str(shared), every_k_flush=flush, keep=3, on_done=done)
    return tier, start


if __name__ == "__main__":
    sys.exit(main())
