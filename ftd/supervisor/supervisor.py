"""The supervisor's loop: this node's ranks, generation after generation, as the agent relays.

What: :class:`Supervisor`. Generation 0 needs no coordinator: an active node starts its ranks at
once; a spare runs the preflight and waits idle (with a warm interpreter when ``--warm``), or
reports ``failed`` when the preflight fails. Then it
follows the agent (:mod:`ftd.supervisor.agent_link`): a ``restart`` for a newer generation stops
what is left of the old ranks and either starts generation g on slot i (after a preflight when the
node was a spare or never checked; a failed one is state ``failed`` with no ranks), or takes the
node out, or leaves a spare as it is (:func:`ftd.supervisor.assignment.on_restart`); a ``stop``
for the current generation means the ranks will exit on purpose (they save first), so their exit
waits for the next generation instead of ending the supervisor. Every change is reported to the
agent at once. How it ends: an active node whose ranks all exit 0 reports ``exited`` and exits 0
(training done); a rank exiting non-zero stops the others, reports ``exited`` with its code and
waits ``--exit-grace`` for a restart before exiting with that code; spares and out nodes exit 0 when
the coordinator releases them (a ``release`` directive: the job's training ended), never on their
own; SIGTERM/SIGINT stop the ranks, say goodbye, exit 128+N.
The scheduler's signals reach the ranks as what they mean (issue #37): SIGUSR1 (``sbatch
--signal=USR1@600``) is forwarded to every rank (the client turns it into a save); SIGTERM is
forwarded as SIGTERM (the client's save then stop) with a grace up to the deadline
(:mod:`ftd.supervisor.deadline`: a preempted Slurm job's PreemptTime + GraceTime, else
``--stop-grace``) before the SIGKILL; under Slurm the supervisor then waits for Slurm to end the job
(Slurm requeues a preempted job only if it ends it itself), up to that deadline plus a margin.
Decisions are logged on stderr (``ftd run: ...``).
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import time

from ftd.supervisor import deadline as deadlines
from ftd.supervisor import output
from ftd.supervisor.agent_link import AgentLink
from ftd.supervisor.assignment import (
    Options,
    another_run,
    gen0_master_addr,
    initial_role,
    on_restart,
    parse_restart,
    rank_env,
    run_name,
)
from ftd.supervisor.preflight import run_preflight
from ftd.supervisor.ranks import RankGroup
from ftd.supervisor.warm import WarmPool, give, warm_script

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

__all__ = ["Supervisor"]

_log = logging.getLogger("ftd.supervisor")
_TICK_S = 0.1


class Supervisor:
    """One node's supervisor of job ``opts.job`` (see the module docstring)."""

    def __init__(
        self,
        opts: Options,
        env: Mapping[str, str],
        *,
        first_host: str | None = None,
        link_factory: Callable[..., AgentLink] = AgentLink,
    ) -> None:
        self.opts = opts
        self.env = dict(env)
        self.role, self.slot = initial_role(opts, env)
        self.generation = 0
        self.acted = 0  # the newest generation a restart was acted on (0: the first, no directive)
        self.state = "idle"
        self.preflight: str | None = None
        self.reason = ""
        self.exit_code: int | None = None
        self.warm = False
        self.master_addr = gen0_master_addr(opts, env, first_host)
        self.group: RankGroup | None = None
        self.stop_asked = False
        self.exit_deadline: float | None = None
        self.released = False  # a release directive came: the job's training ended (spare, out)
        self.pool: WarmPool | None = None
        self.link: AgentLink | None = None
        self._signal: int | None = None
        self._save_signals = 0  # SIGUSR1s received, not yet forwarded to the ranks
        self._link_factory = link_factory
        self.pid = os.getpid()

    # --- reporting ----------------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        """Every :class:`ftd.events.SupervisorInfo` field, as this supervisor stands."""
        return {
            "role": self.role,
            "slot": self.slot,
            "generation": self.generation,
            "state": self.state,
            "nodes": self.opts.nodes,
            "nproc": self.opts.nproc,
            "addr": self.opts.addr,
            "preflight": self.preflight,
            "reason": self.reason,
            "exit_code": self.exit_code,
            "warm": self.warm,
            "pid": self.pid,
            "ts": time.time(),
            "run": self.opts.run,
        }

    def _report(self, **changes: Any) -> None:
        for name, value in changes.items():
            setattr(self, name, value)
        _log.info(
            "ftd run: job %s role %s slot %s generation %d state %s%s",
            self.opts.job,
            self.role,
            self.slot,
            self.generation,
            self.state,
            f" ({self.reason})" if self.reason else "",
        )
        if self.link is not None:
            self.link.update(self.info())

    def node_name(self) -> str:
        """This node's name as the coordinator knows it: the agent's word, else ``--node``/env."""
        if self.link is not None and self.link.node:
            return self.link.node
        return self.opts.node or ""

    # --- the loop -----------------------------------------------------------------------------

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        signal.signal(signal.SIGUSR1, self._on_save_signal)
        if self.opts.job and self.opts.socket:
            self.link = self._link_factory(self.opts.socket, self.opts.job, self.pid, self.info())
            self.link.start()
        else:
            _log.warning("ftd run: no job id or socket: running without the agent (no restarts)")
        script = warm_script(self.opts.command)
        if self.opts.warm and script is None:
            _log.warning("ftd run: --warm needs a command of the form 'python script.py ...': starting cold")
        elif self.opts.warm:
            self.pool = WarmPool(
                self.opts.command[0],
                self.opts.warm,
                self.env,
                self.opts.nproc,
                node=self.node_name if self.opts.prefix else None,
            )
        if self.role == "active":
            assert self.slot is not None
            self._start_generation(
                0, self.slot, self.master_addr, _env_int(self.env, "FTD_RESUME_STEP"), False
            )
        else:
            self._idle_spare()
        try:
            while True:
                if self._signal is not None:
                    return self._terminate(self._signal)
                if self._save_signals:
                    self._forward_save()
                if self.released:
                    self._report(state="exited", exit_code=0, reason="released: the job's training ended")
                    return self._goodbye(0)
                self._take_directives()
                ended = self._watch_ranks()
                if ended is not None:
                    return ended
                self._watch_warm()
        finally:
            if self.pool is not None:
                self.pool.close()

    def _on_signal(self, signum: int, frame: object) -> None:
        self._signal = signum

    def _on_save_signal(self, signum: int, frame: object) -> None:
        self._save_signals += 1

    def _forward_save(self) -> None:
        """SIGUSR1 (the scheduler's early warning) to every rank: the client's save."""
        self._save_signals = 0
        group = self.group
        if group is None or not group.alive():
            _log.info("ftd run: SIGUSR1: no ranks running to save")
            return
        _log.info(
            "ftd run: SIGUSR1: asking generation %d's ranks (pids %s) to save", group.generation, group.pids
        )
        group.signal(signal.SIGUSR1)

    def _idle_spare(self) -> None:
        if self.link is None or not self.link.connected.wait(2.0):
            _log.warning(
                "ftd run: spare node without a reachable agent: it can never be told to start "
                "(it keeps retrying the agent at %s)",
                self.opts.socket,
            )
        if self.opts.preflight is not None:
            self._report(state="idle")
            ok, why = run_preflight(self.opts.preflight)
            # A spare that fails its check is ``failed`` (an event at the agent): it cannot take a slot.
            self._report(preflight="ok" if ok else "failed", state="idle" if ok else "failed", reason=why)
        else:
            self._report(state="idle")
        if self.pool is not None:
            self.pool.fill()

    def _take_directives(self) -> None:
        if self.link is None:
            time.sleep(_TICK_S)
            return
        try:
            msg = self.link.directives.get(timeout=_TICK_S)
        except queue.Empty:
            return
        action = msg.get("action")
        if action == "restart":
            self._restart(msg)
        elif action == "release":
            self._release(msg)
        elif action == "stop":
            named = (msg.get("params") or {}).get("run")
            if isinstance(named, str) and named and named != run_name(self.opts, self.generation):
                _log.info(
                    "ftd run: stop %s is for run %s, not ours (%s): ignored",
                    msg.get("id"),
                    named,
                    run_name(self.opts, self.generation),
                )
                return
            self.stop_asked = True
            _log.info(
                "ftd run: stop %s for generation %d: its ranks exit on purpose",
                msg.get("id"),
                self.generation,
            )
        else:
            _log.info("ftd run: directive %s (%s) is not for the supervisor: ignored", msg.get("id"), action)

    def _release(self, msg: Mapping[str, Any]) -> None:
        """The job's training ended (the coordinator saw its slots exit 0): a supervisor that holds
        no slot exits 0 so the job step can end; one of another run of the job, or holding a slot
        (its ranks decide when it ends), ignores it."""
        params = msg.get("params") or {}
        runs = params.get("runs") if isinstance(params, dict) else None
        meant = another_run(runs, self.node_name(), self.opts.run)
        if meant is not None:
            _log.info(
                "ftd run: release %s is for run %s, not ours (%s): ignored",
                msg.get("id"),
                meant,
                self.opts.run,
            )
            return
        if self.role == "active":
            _log.info("ftd run: release %s ignored: this node holds slot %s", msg.get("id"), self.slot)
            return
        _log.info(
            "ftd run: release %s: the job's training ended; this %s node leaves", msg.get("id"), self.role
        )
        self._stop_ranks()
        self.released = True

    def _restart(self, msg: Mapping[str, Any]) -> None:
        params = msg.get("params") or {}
        restart = parse_restart(params if isinstance(params, dict) else {})
        if isinstance(restart, str):
            _log.error("ftd run: restart %s ignored: %s", msg.get("id"), restart)
            return
        node = self.node_name()
        what, slot = on_restart(restart, node, self.acted, self.opts.run)
        _log.info(
            "ftd run: restart %s generation %d: node %s -> %s%s (path %s)",
            msg.get("id"),
            restart.generation,
            node,
            what,
            f" slot {slot}" if slot is not None else "",
            restart.path or "?",
        )
        if what == "ignore":
            return
        self.acted = restart.generation
        if what == "active":
            assert slot is not None
            check = self.opts.preflight is not None and (self.role != "active" or self.preflight is None)
            self._start_generation(
                restart.generation,
                slot,
                restart.master_addr,
                restart.resume_step,
                check,
                resume_level=restart.resume_level,
                resume_path=restart.resume_path,
            )
        elif what == "out":
            self._stop_ranks()
            self._report(role="out", slot=None, state="stopped", reason="", exit_deadline=None)

    def _stop_ranks(self, grace_s: float | None = None) -> None:
        group, self.group = self.group, None
        if group is not None and group.alive():
            _log.info("ftd run: stopping generation %d's ranks (pids %s)", group.generation, group.pids)
        if group is not None:
            group.stop(self.opts.stop_grace_s if grace_s is None else grace_s)

    def _start_generation(
        self,
        generation: int,
        slot: int,
        master_addr: str,
        resume_step: int | None,
        check: bool,
        *,
        resume_level: str | None = None,
        resume_path: str | None = None,
    ) -> None:
        self._stop_ranks()
        self.stop_asked, self.exit_deadline = False, None
        self._report(
            role="active", slot=slot, generation=generation, state="starting", reason="", exit_code=None
        )
        if check:
            assert self.opts.preflight is not None
            ok, why = run_preflight(self.opts.preflight)
            self.preflight = "ok" if ok else "failed"
            if not ok:
                self._report(state="failed", reason=why)
                return
        envs = [
            {
                **self.env,
                **rank_env(
                    self.opts,
                    generation=generation,
                    slot=slot,
                    local_rank=local,
                    master_addr=master_addr,
                    resume_step=resume_step,
                    resume_level=resume_level,
                    resume_path=resume_path,
                ),
            }
            for local in range(self.opts.nproc)
        ]
        group = RankGroup(generation)
        warm = self.pool.take(self.opts.nproc) if self.pool is not None and generation > 0 else None
        try:
            if warm is not None:
                for index, proc in enumerate(warm):  # (no zip(strict=): Python 3.9)
                    if self.pool is not None:
                        self.pool.name(proc, output.label(self.node_name(), envs[index]["RANK"]))
                    give(proc, self.opts.command, envs[index], os.getcwd())
                    group.adopt(proc)
            else:
                labels = (
                    [output.label(self.node_name(), env["RANK"]) for env in envs]
                    if self.opts.prefix
                    else None
                )
                group.start_cold(self.opts.command, envs, labels=labels)
        except OSError as exc:
            group.stop(self.opts.stop_grace_s)
            self._report(state="failed", reason=f"cannot start {self.opts.command[0]}: {exc}")
            return
        self.group = group
        _log.info(
            "ftd run: generation %d started on slot %d (%s, pids %s, MASTER_ADDR %s MASTER_PORT %d)",
            generation,
            slot,
            "warm" if warm is not None else "cold",
            group.pids,
            master_addr,
            self.opts.master_port + generation,
        )
        self._report(state="running", warm=False)
        if self.pool is not None:
            self.pool.fill()  # the next generation's interpreters import while this one trains

    def _watch_ranks(self) -> int | None:
        """The supervisor's exit code once it must end, else None."""
        group = self.group
        now = time.monotonic()
        if group is not None:
            outcome = group.poll()
            if outcome.state == "done" and not self.stop_asked:
                self.group = None
                self._report(state="exited", exit_code=0)
                return self._goodbye(0)
            if outcome.state != "running":
                if outcome.state == "failed":
                    _log.warning(
                        "ftd run: a rank of generation %d exited %s: stopping the others",
                        group.generation,
                        outcome.exit_code,
                    )
                self._stop_ranks()
                code = outcome.exit_code if outcome.exit_code is not None else 0
                state = "stopped" if self.stop_asked else "exited"
                self.exit_deadline = now + self.opts.exit_grace_s
                self._report(state=state, exit_code=code)
                _log.info("ftd run: waiting up to %.0f s for a restart", self.opts.exit_grace_s)
        if self.role == "active" and self.exit_deadline is not None and now >= self.exit_deadline:
            code = self.exit_code or 0
            _log.warning("ftd run: no restart within %.0f s: exiting %d", self.opts.exit_grace_s, code)
            self._report(state="exited")
            return self._goodbye(code)
        return None

    def _watch_warm(self) -> None:
        if self.pool is None:
            return
        ready = self.pool.ready()
        if ready != self.warm:
            self._report(warm=ready)

    def _terminate(self, signum: int) -> int:
        if signum != signal.SIGTERM:
            _log.info("ftd run: signal %d: stopping the ranks and leaving", signum)
            self._stop_ranks()
            self._report(state="exited", exit_code=128 + signum)
            return self._goodbye(128 + signum)
        now = time.time()
        known = deadlines.known_deadline(self.env, socket_path=self.opts.socket or None)
        grace, why = deadlines.stop_grace(self.opts.stop_grace_s, now, known)
        _log.info("ftd run: SIGTERM: the ranks save and stop; %.1f s until SIGKILL (%s)", grace, why)
        self._stop_ranks(grace)
        self._report(state="exited", exit_code=128 + signum)
        code = self._goodbye(128 + signum)
        if known is not None and self.env.get("SLURM_JOB_ID"):
            self._wait_for_slurm(known[0])
        return code

    def _wait_for_slurm(self, deadline: float) -> None:
        """Slurm requeues a preempted job only if it ends the job itself: leave that to it (its
        next SIGTERM, at the deadline, or its SIGKILL) rather than end the step early."""
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        wait = min(deadline - time.time() + 30.0, deadlines.MAX_GRACE_S)
        if wait > 0:
            _log.info("ftd run: ranks stopped; waiting up to %.0f s for Slurm to end the job", wait)
            time.sleep(wait)

    def _goodbye(self, code: int) -> int:
        if self.link is not None:
            self.link.goodbye(self.info())
        return code


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name, "").strip()
    return int(raw) if raw.lstrip("-").isdecimal() else None
