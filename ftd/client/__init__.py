"""Trainer client: how a training rank hears ``save``/``stop`` from its node's ftd agent.

Three lines in the training loop::

    from ftd.client import Client

    client = Client()  # job/rank from FTD_JOB|SLURM_JOB_ID|TORCHELASTIC_RUN_ID, RANK|SLURM_PROCID
    for step in range(start, steps):
        train_step()
        client.heartbeat(step)
        if client.should_save():
            path = save_checkpoint(step)
            client.ack_saved(step, path)
        if client.should_stop():
            break

Why it looks like this:

- **Standard library only, imported fast**: it lives inside every training process; it must not
  pull the daemon's dependencies (or anything from ``ftd`` but this package) into a training image.
- **Fail-open**: the agent being absent, down, restarting or misbehaving never raises into training
  code and never blocks a step. All socket I/O happens on one daemon thread that connects (and
  reconnects, with backoff up to ``retry_interval`` seconds, forever), registers, reads pushed
  directives and sends heartbeats and acks. Without an agent every call still returns at once and
  ``should_save()``/``should_stop()`` are simply False. Fail-open is never silent: the first time
  the agent cannot be reached (EACCES, ENOENT, ECONNREFUSED) or refuses the registration, one line
  goes to stderr saying the job is not protected, with a hint (e.g. "ask the admin to set
  agent.socket_group"); later failures go to the ``ftd.client`` logger only.
- **Cheap per step**: :meth:`Client.should_save` and :meth:`Client.should_stop` only read or
  write attributes (well under a microsecond each; see ``ftd.bench.client``);
  :meth:`Client.heartbeat` also times the step (one clock read and a few additions, about a
  microsecond on the loaded 2-core development machine: :mod:`ftd.client.timing`). The I/O
  thread sends at most one heartbeat per ``heartbeat_interval``
  (0.2 s), and only if ``heartbeat()`` was called since the previous one, so a hung training loop
  goes silent at the agent, which is how hangs are detected.

A ``stop`` makes :meth:`Client.should_stop` true for the rest of the process. :meth:`Client.close`
(or leaving the ``with`` block) acknowledges pending stops ("exiting") on a best-effort basis.
Directives addressed to another job are ignored.

Other sources map onto the same two flags (so the training loop has one place to look):

- **Signals** (by default, main thread only): ``SIGTERM`` -> save then stop, ``SIGUSR1`` -> save,
  each only where its handler is still ``SIG_DFL`` (a handler the user installed is never
  replaced; ``$FTD_SIGNALS=0`` or ``Client(signals=False)``: none). ``Client(signals=True)`` (or
  :meth:`Client.install_signal_handlers`) takes both in any case: a Python handler installed
  before ours is still called after ours; ``SIG_DFL``/``SIG_IGN`` are not (calling the default
  SIGTERM action would kill the process before it can save, which is the point of catching it). A
  second SIGTERM, or one after :meth:`Client.close`, gets the default action. Under Slurm a process
  stopped by SIGTERM waits at exit (``$FTD_TERM_WAIT_S``, default 600 s; ``ftd run`` sets 0) until
  Slurm ends the job: Slurm requeues a preempted job only if it ends it itself. A SIGTERM's save
  that this rank's own measured saves say cannot land before the deadline (``$FTD_DEADLINE_FILE``,
  else Slurm's; :mod:`ftd.client.deadline`) is not started: the loop stops at once and stderr says
  why and which step the job resumes from (``client.save_skipped``).
- **Kill switch** (``stop_file=`` or ``$FTD_STOP_FILE``): while the file exists, ``should_stop()`` is
  true; it is also checked once in the constructor so a queued job array "burns through" at once.
- **Save switch** (``save_file=`` or ``$FTD_SAVE_FILE``): when the file appears, ``should_save()``
  becomes true; the file is removed when the save is answered (acked or nacked), so it triggers one
  save, not one per step.
- **Memory** (:meth:`Client.memory_guard`): host RSS (against ``MemTotal`` or the cgroup's limit) and,
  when the trainer already imported torch and CUDA is available, ``torch.cuda.memory_reserved``
  against the device's total: above the threshold both flags are set (save, then exit before OOM).

The switch files are polled at most every ``switch_poll_s`` (0.2 s) from the per-step calls (one
``stat`` per poll): the hot path stays a few attribute reads.

Save at a step: a ``save`` directive may carry ``params["save_at_step"]`` = S (the coordinator
picks it ahead of the furthest step the job's ranks reported). Then :meth:`Client.should_save` stays
False until the step given to :meth:`Client.heartbeat` is >= S, so every rank saves the same step
without talking to the others (a rank already past S when the directive arrives saves at once: the
coordinator sees the differing steps in the acks). A local trigger (signal, save switch, memory
guard) still saves at once.

Save path: a rank may declare ``checkpoint_dir`` and ``fallback_checkpoint_dir`` (or
``$FTD_CHECKPOINT_DIR`` / ``$FTD_FALLBACK_CHECKPOINT_DIR``). ftd never asks a save onto a filesystem
that is read-only, full or unresponsive: a ``save`` then carries ``params["save_path"]`` (the
fallback), which :attr:`Client.save_path` returns (else ``checkpoint_dir``): write the checkpoint
there. With no usable fallback the job is stopped without a save.

Resume step: a ``stop`` may carry ``params["resume_step"]``, the newest step every rank of the job
saved (it differs from this rank's own save only when the ranks' saves disagreed): it is
:attr:`Client.resume_step`, and with ``resume_file=`` / ``$FTD_RESUME_FILE`` it is written there and
read back by the job's next process (set the variable in the job script: a requeued Slurm job runs
it again), so the restart resumes from a checkpoint every rank has.

Deadlines: a ``save`` directive carries ``deadline_s``. If it is still unanswered that long after it
arrived (the rank is stuck, or its save is failing slowly), the I/O thread answers it with a nack
("save not completed within deadline") so the coordinator learns why instead of waiting for silence.

Exit status (Kubernetes): a rank that leaves its loop because the coordinator sent ``stop`` should end
with :meth:`Client.exit_status`: 0 on Slurm (ftd requeues the job itself), but on Kubernetes
(``KUBERNETES_SERVICE_HOST`` is set in every pod) :data:`STOP_EXIT_CODE` (75, EX_TEMPFAIL; or
``$FTD_STOP_EXIT_CODE``): a Job whose pods exit 0 is *Complete* and nothing recreates them, while a
pod that fails with 75 is replaced (give the Job ``podFailurePolicy: onExitCodes [75] -> Ignore`` so
the restart is not counted in ``backoffLimit``; ``deploy/kubernetes/training-job-example.yaml``).

The wire protocol (newline-delimited JSON over a unix socket, version 1) is
:mod:`ftd.client.protocol`; the agent's end is ``ftd/agent/local_api/``.

Layout (one job per module; this package face only re-exports): :mod:`ftd.client.client` (the
:class:`Client` the loop calls), :mod:`ftd.client.connection` (its I/O thread),
:mod:`ftd.client.triggers` (signals, switch files, memory guard), :mod:`ftd.client.state` (the
fields they share and the threading rules), :mod:`ftd.client.directive`, :mod:`ftd.client.memory`,
:mod:`ftd.client.files` and :mod:`ftd.client.environment` (helpers), :mod:`ftd.client.protocol`
(the wire format); :mod:`ftd.client.manifest`, :mod:`ftd.client.saves`, :mod:`ftd.client.levels`
and :mod:`ftd.client.retention` (checkpoint manifests, reporting a save, probing a save level,
retention); the framework adapters :mod:`ftd.client.torch`, :mod:`ftd.client.lightning`,
:mod:`ftd.client.hf` and the PyTorch checkpoint tier :mod:`ftd.client.checkpoint` /
:mod:`ftd.client.resume` import their framework and are never imported from here.
"""

from __future__ import annotations

from ftd.client.client import STOP_EXIT_CODE, Client
from ftd.client.directive import DEADLINE_REASON, DirectiveInfo
from ftd.client.environment import DEFAULT_JOB
from ftd.client.protocol import DEFAULT_SOCKET, PROTOCOL_VERSION

__all__ = [
    "DEADLINE_REASON",
    "DEFAULT_JOB",
    "DEFAULT_SOCKET",
    "PROTOCOL_VERSION",
    "STOP_EXIT_CODE",
    "Client",
    "DirectiveInfo",
]
