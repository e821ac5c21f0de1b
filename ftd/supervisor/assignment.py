"""Where this node stands in its job, and the environment of its ranks: pure functions.

What: :class:`Options` (what ``ftd run`` was told), :func:`initial_role` (generation 0 needs no
coordinator: the node's index from ``--node-rank``, ``SLURM_NODEID`` or ``JOB_COMPLETION_INDEX``;
an index below ``--nodes`` holds that slot, any other is a spare), :func:`gen0_master_addr`,
:func:`rank_env` (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT = base +
generation, FTD_RUN = ``<run>.gen-<g>``...) and :func:`on_restart` (what a ``restart`` directive asks of
this node: nothing for a generation already acted on, take slot i, go out, or stay a spare). Why
apart: the rules of the contract (issue #24) in one place, tested without processes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ftd.client.protocol import generation_run

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

__all__ = [
    "Options",
    "Restart",
    "another_run",
    "gen0_master_addr",
    "initial_role",
    "on_restart",
    "parse_restart",
    "rank_env",
    "run_name",
]


@dataclass
class Options:
    """``ftd run``'s options, resolved (see :mod:`ftd.commands.run`)."""

    command: list[str]
    nodes: int
    spares: int = 0
    nproc: int = 1
    node_rank: int | None = None
    job: str | None = None
    master_addr: str | None = None
    master_port: int = 29500
    addr: str = ""
    socket: str = ""
    node: str | None = None  # this node's name until the agent says it (SLURMD_NODENAME, hostname)
    preflight: str | None = "ftd preflight"  # None: skip
    warm: list[str] = field(default_factory=list)
    stop_grace_s: float = 10.0
    exit_grace_s: float = 300.0
    run: str = ""  # the launcher's run of this supervisor (ftd.client.protocol.run_id; "": unknown)
    prefix: bool = True  # each rank's output lines start with "[node rank R] " (issue #33)


class SetupError(ValueError):
    """``ftd run`` cannot work out where this node stands: said to the user, exit 2."""


def node_index(opts: Options, env: Mapping[str, str]) -> int:
    """This node's index in the allocation: ``--node-rank``, ``SLURM_NODEID``,
    ``JOB_COMPLETION_INDEX`` (a Kubernetes indexed Job); 0 for a one-node job."""
    if opts.node_rank is not None:
        return opts.node_rank
    for name in ("SLURM_NODEID", "JOB_COMPLETION_INDEX"):
        raw = env.get(name, "").strip()
        if raw:
            if not raw.isdecimal():
                raise SetupError(f"{name}={raw!r} is not a node index (a non-negative integer)")
            return int(raw)
    if opts.nodes + opts.spares <= 1:
        return 0
    raise SetupError(
        "cannot tell this node's index: give --node-rank, or run under srun (SLURM_NODEID) or as a "
        "Kubernetes indexed Job (JOB_COMPLETION_INDEX)"
    )


def initial_role(opts: Options, env: Mapping[str, str]) -> tuple[str, int | None]:
    """Generation 0: (``active``, slot) for an index below ``--nodes``, else (``spare``, None)."""
    index = node_index(opts, env)
    if index < opts.nodes:
        return "active", index
    return "spare", None


def gen0_master_addr(opts: Options, env: Mapping[str, str], first_host: str | None) -> str:
    """Generation 0's MASTER_ADDR: ``--master-addr``, ``$MASTER_ADDR``, the first host of the Slurm
    allocation (``first_host``, from ``scontrol show hostnames``), else this node's address."""
    return opts.master_addr or env.get("MASTER_ADDR") or first_host or opts.addr or "127.0.0.1"


def run_name(opts: Options, generation: int) -> str:
    """The client's run id for a generation (``FTD_RUN``): a run-bound directive never reaches another,
    and a requeued job's generation 0 is a new run (``slurm-restart-1.gen-0``)."""
    return generation_run(opts.run, generation)


def rank_env(
    opts: Options,
    *,
    generation: int,
    slot: int,
    local_rank: int,
    master_addr: str,
    resume_step: int | None,
    resume_level: str | None = None,
    resume_path: str | None = None,
) -> dict[str, str]:
    """The variables one rank of ``generation`` on slot ``slot`` gets (over the supervisor's own)."""
    if opts.job is None:
        job_env: dict[str, str] = {}
    else:
        job_env = {"FTD_JOB_ID": opts.job, "FTD_JOB": opts.job}  # FTD_JOB: the client's job variable
    out = {
        "RANK": str(slot * opts.nproc + local_rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(opts.nodes * opts.nproc),
        "LOCAL_WORLD_SIZE": str(opts.nproc),
        "GROUP_RANK": str(slot),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(opts.master_port + generation),
        "FTD_RUN": run_name(opts, generation),
        "FTD_GENERATION": str(generation),
        # The client waits at exit after a SIGTERM under Slurm so that Slurm ends (and may requeue)
        # the job; under ftd run the supervisor ends its ranks itself, so they exit at once.
        "FTD_TERM_WAIT_S": "0",
        **job_env,
    }
    if opts.socket:
        out["FTD_SOCKET"] = opts.socket
    if resume_step is not None:
        out["FTD_RESUME_STEP"] = str(resume_step)
        if resume_level:  # the coordinator's verified choice (issue #34): which level, and its root
            out["FTD_RESUME_LEVEL"] = resume_level
        if resume_path:
            out["FTD_RESUME_PATH"] = resume_path
    return out


@dataclass
class Restart:
    """A ``restart`` directive's params, checked (see :func:`parse_restart`)."""

    generation: int
    slots: list[str]
    master_addr: str
    resume_step: int | None
    out: list[str]
    path: str
    runs: dict[str, str] = field(default_factory=dict)  # node -> its supervisor's run, when known
    resume_level: str | None = None  # local / partner / shared: the level the coordinator chose
    resume_path: str | None = None  # that level's checkpoint root


def parse_restart(params: Mapping[str, Any]) -> Restart | str:
    """The restart's params, or why they are unusable (the directive is then ignored, logged)."""
    gen = params.get("generation")
    slots = params.get("slots")
    if not isinstance(gen, int) or isinstance(gen, bool) or gen < 0:
        return f"generation {gen!r} is not a non-negative integer"
    if not isinstance(slots, list) or not slots or not all(isinstance(s, str) and s for s in slots):
        return f"slots {slots!r} is not a list of node names"
    addr = params.get("master_addr")
    if not isinstance(addr, str) or not addr:
        return f"master_addr {addr!r} is not an address"
    resume = params.get("resume_step")
    if resume is not None and (not isinstance(resume, int) or isinstance(resume, bool)):
        return f"resume_step {resume!r} is not an integer"
    out = params.get("out") or []
    if not isinstance(out, list) or not all(isinstance(s, str) for s in out):
        return f"out {out!r} is not a list of node names"
    path = params.get("path")
    runs = params.get("runs") or {}
    if not isinstance(runs, dict) or not all(isinstance(v, str) for v in runs.values()):
        return f"runs {runs!r} is not a map of node names to runs"
    level = params.get("resume_level")
    root = params.get("resume_path")
    return Restart(
        gen,
        list(slots),
        addr,
        resume,
        list(out),
        path if isinstance(path, str) else "",
        dict(runs),
        resume_level=level if isinstance(level, str) and level in ("local", "partner", "shared") else None,
        resume_path=root if isinstance(root, str) and root.startswith("/") else None,
    )


def another_run(runs: object, node: str, run: str) -> str | None:
    """The run a directive's ``runs`` (node -> supervisor run) names for ``node`` when it is not this
    supervisor's ``run`` (sent to an earlier run of the job, delivered after a requeue), else None:
    for this run, or not known on either side."""
    meant = runs.get(node) if isinstance(runs, dict) else None
    return meant if isinstance(meant, str) and meant and run and meant != run else None


def on_restart(restart: Restart, node: str, acted: int, run: str = "") -> tuple[str, int | None]:
    """What ``restart`` asks of ``node`` whose supervisor (of run ``run``) last acted on generation
    ``acted``: (``ignore``, None) for a generation already acted on (an idempotent re-send) or a
    restart meant for another run of the job on this node (``runs[node]``: sent before a scheduler
    requeue, delivered after it), (``active``, slot) for a node in ``slots``, (``out``, None) for one
    in ``out``, else (``spare``, None)."""
    if restart.generation <= acted or another_run(restart.runs, node, run) is not None:
        return "ignore", None
    if node in restart.slots:
        return "active", restart.slots.index(node)
    if node in restart.out:
        return "out", None
    return "spare", None
