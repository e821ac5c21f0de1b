"""``ftd run`` (issue #24) as real processes against a real agent local API (in this process, one
per node name): generation 0, restart directives (in place, onto a spare, out), an idempotent
re-send, a spare's failing preflight, a supervisor killed with SIGKILL or stopped with SIGTERM, ranks
that finish, and the warm start. The ranks are :mod:`tests.e2e.supervisor_rank` (they write their
environment to a file)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from ftd.agent.local_api import LocalApi
from ftd.events import Directive, Event, Kind, Severity, SupervisorInfo
from tests.unit.helpers import Recorder, until

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
RANK = str(Path(__file__).with_name("supervisor_rank.py"))
WITHIN = 60.0  # generous: two cores, other tests running


def gone(api: LocalApi) -> bool:
    """The job's supervisor said goodbye: the agent keeps it as ``exited`` (how it ended)."""
    info = api.supervisor("j1")
    return info is not None and info.state == "exited" and api._supervisors.conn("j1") is None


class Harness:
    def __init__(self, root: str) -> None:
        self.root = Path(root)
        self.out = self.root / "out"
        self.out.mkdir()
        self.apis: dict[str, LocalApi] = {}
        self.events: list[Event] = []
        self.procs: list[asyncio.subprocess.Process] = []
        self.rec = Recorder()

    async def agent(self, node: str) -> LocalApi:
        async def on_event(event: Event) -> None:
            self.events.append(event)

        api = LocalApi(
            str(self.root / f"{node}.sock"), node, self.rec.on_presence, self.rec.on_ack, on_event=on_event
        )
        await api.start()
        self.apis[node] = api
        return api

    async def supervisor(
        self, node: str, *args: str, env: dict[str, str] | None = None, rank: str = RANK
    ) -> asyncio.subprocess.Process:
        cmd = [
            sys.executable,
            *("-m", "ftd.cli", "run", "--job", "j1", "--socket", str(self.root / f"{node}.sock")),
            *("--master-addr", "127.0.0.1", "--master-port", "29600", "--stop-grace", "5", "--node", node),
            *args,
            *("--", sys.executable, rank),
        ]
        full_env = {
            **os.environ,
            "OUT_DIR": str(self.out),
            "PYTHONPATH": os.pathsep.join([str(REPO), str(self.root)]),
            **(env or {}),
        }
        for name in ("SLURM_JOB_ID", "SLURM_NODEID", "SLURM_NNODES", "MASTER_ADDR", "FTD_SOCKET"):
            full_env.pop(name, None)
        log = (self.root / f"{node}.log").open("ab")  # the child keeps its own copy
        proc = await asyncio.create_subprocess_exec(
            *cmd, env=full_env, stdout=log, stderr=log, start_new_session=True
        )
        log.close()
        self.procs.append(proc)
        return proc

    def record(self, generation: int, rank: int) -> dict[str, Any] | None:
        path = self.out / f"g{generation}-r{rank}.json"
        if not path.exists():
            return None
        data: dict[str, Any] = json.loads(path.read_text())
        return data

    async def wait_record(self, generation: int, rank: int) -> dict[str, Any]:
        await until(lambda: self.record(generation, rank) is not None, WITHIN)
        rec = self.record(generation, rank)
        assert rec is not None
        return rec

    async def wait_sup(self, node: str, **want: Any) -> SupervisorInfo:
        api = self.apis[node]

        def matches() -> bool:
            info = api.supervisor("j1")
            return info is not None and all(getattr(info, k) == v for k, v in want.items())

        try:
            await until(matches, WITHIN)
        except AssertionError:
            raise AssertionError(
                f"{node}: supervisor {api.supervisor('j1')} never matched {want}\n{self.logs()}"
            ) from None
        info = api.supervisor("j1")
        assert info is not None
        return info

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.root.glob("*.log")))

    async def restart(
        self, generation: int, slots: list[str], out: Sequence[str] = (), *, id: str = "", **params: Any
    ) -> None:
        directive = Directive(
            id=id or f"a1-restart-g{generation}",
            ts=time.time(),
            action="restart",
            job="j1",
            params={
                "generation": generation,
                "slots": slots,
                "master_addr": params.pop("master_addr", "127.0.0.1"),
                "resume_step": params.pop("resume_step", None),
                "out": list(out),
                "path": params.pop("path", "in_place"),
            },
        )
        for api in self.apis.values():
            await api.deliver(directive)

    async def close(self) -> None:
        for proc in self.procs:  # SIGTERM first: a supervisor stops its ranks itself
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), WITHIN)
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
        for path in self.out.glob("g*.json"):  # ranks a killed supervisor left behind
            with contextlib.suppress(ProcessLookupError, ValueError, KeyError):
                os.killpg(int(json.loads(path.read_text())["pid"]), signal.SIGKILL)
        for api in self.apis.values():
            await api.stop()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    root = tempfile.mkdtemp(prefix="ftdrun", dir="/tmp")  # unix socket paths must stay short
    harness = Harness(root)
    try:
        yield harness
    finally:
        await harness.close()
        shutil.rmtree(root, ignore_errors=True)


async def test_restart_starts_the_generation_with_its_env_once(h: Harness) -> None:
    api = await h.agent("node1")
    await h.supervisor(
        "node1", "--nodes", "2", "--node-rank", "0", "--nproc-per-node", "2", "--preflight", "none"
    )
    g0 = [await h.wait_record(0, 0), await h.wait_record(0, 1)]
    assert [(r["RANK"], r["LOCAL_RANK"], r["WORLD_SIZE"], r["MASTER_PORT"], r["FTD_RUN"]) for r in g0] == [
        ("0", "0", "4", "29600", "gen-0"),
        ("1", "1", "4", "29600", "gen-0"),
    ]
    await h.wait_sup("node1", role="active", slot=0, generation=0, state="running", nproc=2, nodes=2)

    await h.restart(1, ["other", "node1"], master_addr="10.9.9.9", resume_step=40)
    g1 = [await h.wait_record(1, 2), await h.wait_record(1, 3)]
    info = await h.wait_sup("node1", role="active", slot=1, generation=1, state="running")
    assert [{k: r[k] for k in r if k not in ("pid", "started", "warm_marker_imported_at")} for r in g1] == [
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank - 2),
            "WORLD_SIZE": "4",
            "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "1",
            "MASTER_ADDR": "10.9.9.9",
            "MASTER_PORT": "29601",  # base + generation: a fresh rendezvous
            "FTD_RUN": "gen-1",
            "FTD_GENERATION": "1",
            "FTD_JOB_ID": "j1",
            "FTD_RESUME_STEP": "40",
            "FTD_RESUME_LEVEL": None,  # the restart named no verified checkpoint (issue #34)
            "FTD_RESUME_PATH": None,
            "FTD_SOCKET": api.socket_path,
            "FTD_WARM_READY_AT": None,
        }
        for rank in (2, 3)
    ]
    assert info.preflight is None  # --preflight none
    assert not any(alive(r["pid"]) for r in g0)  # the old generation was stopped

    # The same generation again (a coordinator's re-send under another id): ignored. Generation 2
    # after it shows the re-send was read (directives are taken in order) and changed nothing.
    await h.restart(1, ["other", "node1"], id="a1-restart-g1-again")
    await h.restart(2, ["node1", "other"])
    await h.wait_record(2, 0)
    await h.wait_sup("node1", slot=0, generation=2, state="running")
    assert h.record(1, 2) == g1[0]  # written once: generation 1 was not started again
    assert "restart a1-restart-g1-again generation 1: node node1 -> ignore" in h.logs()
    assert h.events == []


async def test_spare_takes_the_slot_and_the_failed_node_goes_out(h: Harness) -> None:
    await h.agent("node1")
    await h.agent("node2")
    await h.supervisor("node1", "--nodes", "1", "--spares", "1", "--node-rank", "0", "--preflight", "none")
    await h.supervisor("node2", "--nodes", "1", "--spares", "1", "--node-rank", "1", "--preflight", "true")
    g0 = await h.wait_record(0, 0)
    await h.wait_sup("node1", role="active", slot=0, state="running")
    await h.wait_sup("node2", role="spare", slot=None, state="idle", preflight="ok")

    await h.restart(1, ["node2"], ["node1"], path="spare", master_addr="node2-addr", resume_step=7)
    g1 = await h.wait_record(1, 0)
    await h.wait_sup("node2", role="active", slot=0, generation=1, state="running", preflight="ok")
    await h.wait_sup("node1", role="out", slot=None, state="stopped")
    assert (g1["MASTER_ADDR"], g1["MASTER_PORT"], g1["FTD_RESUME_STEP"]) == ("node2-addr", "29601", "7")
    await until(lambda: not alive(g0["pid"]), WITHIN)  # the out node's ranks are stopped
    assert h.events == []


async def test_spare_failing_preflight_is_failed_with_an_event(h: Harness) -> None:
    await h.agent("node2")
    await h.supervisor("node2", "--nodes", "1", "--spares", "1", "--node-rank", "1", "--preflight", "false")
    info = await h.wait_sup("node2", role="spare", state="failed", preflight="failed")
    assert info.reason == "preflight false exited 1"
    await until(lambda: len(h.events) == 1, WITHIN)
    event = h.events[0]
    assert (event.kind, event.severity, event.node) == (Kind.SUPERVISOR, Severity.ERROR, "node2")
    assert event.data == {
        "job": "j1",
        "state": "failed",
        "role": "spare",
        "slot": None,
        "generation": 0,
        "reason": "preflight false exited 1",
    }
    # Given a slot anyway, it checks again before starting anything, and fails again: no ranks.
    await h.restart(1, ["node2"])
    await h.wait_sup("node2", role="active", slot=0, generation=1, state="failed", preflight="failed")
    await until(lambda: len(h.events) == 2, WITHIN)
    assert h.events[1].data["generation"] == 1
    assert list(h.out.glob("g*.json")) == []


async def test_supervisor_killed_is_lost_with_an_event(h: Harness) -> None:
    await h.agent("node1")
    proc = await h.supervisor("node1", "--nodes", "1", "--preflight", "none")
    await h.wait_record(0, 0)  # the rank is up (and the teardown can find it: it outlives the kill)
    await h.wait_sup("node1", state="running")
    os.kill(proc.pid, signal.SIGKILL)
    await h.wait_sup("node1", state="lost", role="active", slot=0)
    await until(lambda: len(h.events) == 1, WITHIN)
    assert h.events[0].data == {"job": "j1", "state": "lost", "role": "active", "slot": 0, "generation": 0}


async def test_sigterm_stops_the_ranks_and_says_goodbye(h: Harness) -> None:
    api = await h.agent("node1")
    proc = await h.supervisor("node1", "--nodes", "1", "--nproc-per-node", "2", "--preflight", "none")
    ranks = [await h.wait_record(0, 0), await h.wait_record(0, 1)]
    await h.wait_sup("node1", state="running")
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), WITHIN) == 128 + signal.SIGTERM
    assert not any(alive(r["pid"]) for r in ranks)
    await until(lambda: gone(api), WITHIN)  # the goodbye: exited, not lost
    assert api.supervisor("j1").exit_code == 128 + signal.SIGTERM  # type: ignore[union-attr]
    assert h.events == []


async def test_ranks_that_finish_end_the_supervisor(h: Harness) -> None:
    api = await h.agent("node1")
    proc = await h.supervisor("node1", "--nodes", "1", "--preflight", "none", env={"RANK_MODE": "exit"})
    assert await asyncio.wait_for(proc.wait(), WITHIN) == 0
    await until(lambda: gone(api), WITHIN)
    assert api.supervisor("j1").exit_code == 0  # type: ignore[union-attr]
    # A rank failing: exited with its code, waits --exit-grace for a restart, then exits with it.
    failing = await h.supervisor(
        "node1",
        "--nodes",
        "1",
        "--preflight",
        "none",
        "--exit-grace",
        "1",
        env={"RANK_MODE": "exit", "RANK_EXIT": "3"},
    )
    assert await asyncio.wait_for(failing.wait(), WITHIN) == 3
    assert h.events == []


async def test_a_release_ends_the_spares_never_a_slot_and_only_for_their_run(h: Harness) -> None:
    """The coordinator's release (the job's training ended): the spare's supervisor exits 0 (its
    srun task or pod can end), the one holding a slot ignores it, and a release meant for another
    run of the job on the spare's node (sent before a requeue) changes nothing."""
    await h.agent("node1")
    await h.agent("node2")
    active = await h.supervisor("node1", "--nodes", "1", "--preflight", "none", env={"FTD_RUN": "r1"})
    spare = await h.supervisor(
        "node2", "--nodes", "1", "--node-rank", "1", "--preflight", "none", env={"FTD_RUN": "r1"}
    )
    await h.wait_sup("node1", role="active", state="running", run="r1")
    await h.wait_sup("node2", role="spare", state="idle", run="r1")

    async def release(did: str, runs: dict[str, str]) -> None:
        params = {"generation": 0, "runs": runs}
        directive = Directive(id=did, ts=time.time(), action="release", job="j1", params=params)
        for api in h.apis.values():
            await api.deliver(directive)

    await release("rel-old", {"node1": "r0", "node2": "r0"})
    await until(lambda: "is for run r0, not ours (r1): ignored" in h.logs(), WITHIN)
    assert spare.returncode is None
    await release("rel-1", {"node1": "r1", "node2": "r1"})
    assert await asyncio.wait_for(spare.wait(), WITHIN) == 0
    info = await h.wait_sup("node2", state="exited", exit_code=0)
    assert info.reason == "released: the job's training ended" and gone(h.apis["node2"])
    assert "release rel-1 ignored: this node holds slot 0" in h.logs()
    assert active.returncode is None
    await h.wait_sup("node1", role="active", state="running")
    assert h.events == []


async def test_warm_start_runs_the_script_with_the_imports_already_loaded(h: Harness) -> None:
    (h.root / "warm_marker.py").write_text("import time\nIMPORTED_AT = time.time()\n")
    await h.agent("node1")
    await h.supervisor("node1", "--nodes", "1", "--preflight", "none", "--warm", "warm_marker")
    g0 = await h.wait_record(0, 0)
    assert g0["warm_marker_imported_at"] is None  # generation 0 starts cold
    await h.wait_sup("node1", state="running", warm=True)
    sent = time.time()
    await h.restart(1, ["node1"])
    g1 = await h.wait_record(1, 0)
    assert g1["warm_marker_imported_at"] is not None and g1["warm_marker_imported_at"] < sent
    assert g1["FTD_WARM_READY_AT"] is not None and float(g1["FTD_WARM_READY_AT"]) < sent
    assert (g1["RANK"], g1["FTD_RUN"], g1["MASTER_PORT"]) == ("0", "gen-1", "29601")
    assert "generation 1 started on slot 0 (warm" in h.logs()
    await h.wait_sup("node1", generation=1, state="running")


async def test_ranks_stopped_on_purpose_wait_for_the_next_generation(h: Harness) -> None:
    api = await h.agent("node1")
    proc = await h.supervisor(
        "node1", "--nodes", "1", "--preflight", "none", env={"RANK_MODE": "exit_on_file"}
    )
    await h.wait_record(0, 0)
    await h.wait_sup("node1", generation=0, state="running")
    # A stop for another run (an older generation's) changes nothing; one for gen-0 does.
    for did, run in (("a0-stop", "gen-7"), ("a1-stop", "gen-0")):
        await api.deliver(Directive(id=did, ts=time.time(), action="stop", job="j1", params={"run": run}))
    await until(lambda: "stop a1-stop for generation 0" in h.logs(), WITHIN)
    assert "stop a0-stop is for run gen-7, not ours (gen-0): ignored" in h.logs()
    (h.out / "exit-g0").touch()  # the ranks saved and exit 0: not the end of training
    await h.wait_sup("node1", generation=0, state="stopped", exit_code=0)
    assert proc.returncode is None
    await h.restart(1, ["node1"], resume_step=12)
    g1 = await h.wait_record(1, 0)
    assert (g1["FTD_RUN"], g1["FTD_RESUME_STEP"]) == ("gen-1", "12")
    await h.wait_sup("node1", generation=1, state="running", exit_code=None)
    (h.out / "exit-g1").touch()  # no stop this time: training is done
    assert await asyncio.wait_for(proc.wait(), WITHIN) == 0


async def test_agent_restart_the_supervisor_comes_back(h: Harness) -> None:
    api = await h.agent("node1")
    await h.supervisor("node1", "--nodes", "1", "--preflight", "none")
    g0 = await h.wait_record(0, 0)
    await h.wait_sup("node1", generation=0, state="running")
    await api.stop()  # the agent restarts (a new LocalApi on the same socket)
    again = await h.agent("node1")
    await h.wait_sup("node1", generation=0, state="running", role="active")
    assert again.supervisor("j1") is not None and alive(g0["pid"])  # the ranks were never touched
    await h.restart(1, ["node1"])
    await h.wait_record(1, 0)
    assert h.events == []


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
async def test_real_ddp_ranks_meet_in_each_generation(h: Harness, warm: bool) -> None:
    pytest.importorskip("torch")
    ddp = str(Path(__file__).with_name("ddp_rank.py"))
    for node in ("node1", "node2"):
        await h.agent(node)
    extra = ["--warm", "torch,torch.distributed"] if warm else []
    for index, node in enumerate(("node1", "node2")):
        await h.supervisor(
            node, "--nodes", "2", "--node-rank", str(index), "--preflight", "none", *extra, rank=ddp
        )
    if warm:  # generation 1 may only start once both nodes' interpreters have torch imported
        await h.wait_sup("node1", warm=True)
        await h.wait_sup("node2", warm=True)

    def ddp_record(generation: int, rank: int) -> dict[str, Any] | None:
        path = h.out / f"ddp-g{generation}-r{rank}.json"
        return json.loads(path.read_text()) if path.exists() else None

    await until(lambda: ddp_record(0, 0) is not None and ddp_record(0, 1) is not None, 120)
    assert ddp_record(0, 0) == {"rank": 0, "world": 2, "sum": 3.0, "port": "29600", "warm": False}
    # Slots swapped in generation 1: every rank restarts and meets on the next port.
    await h.restart(1, ["node2", "node1"])
    await until(lambda: ddp_record(1, 0) is not None and ddp_record(1, 1) is not None, 120)
    assert ddp_record(1, 0) == {"rank": 0, "world": 2, "sum": 3.0, "port": "29601", "warm": warm}
    assert ddp_record(1, 1) == {"rank": 1, "world": 2, "sum": 3.0, "port": "29601", "warm": warm}
    await h.wait_sup("node2", slot=0, generation=1, state="running")
    await h.wait_sup("node1", slot=1, generation=1, state="running")


async def test_without_an_agent_generation_0_runs_and_the_agent_is_found_later(h: Harness) -> None:
    await h.supervisor("node1", "--nodes", "1", "--preflight", "none")  # no agent listening yet
    g0 = await h.wait_record(0, 0)  # fail-open: the ranks start anyway
    await h.agent("node1")
    info = await h.wait_sup("node1", generation=0, state="running")  # the link kept retrying
    assert alive(g0["pid"]) and info.role == "active"
    assert "cannot reach the ftd agent" in h.logs()


async def test_a_rank_deaf_to_sigterm_is_killed_after_the_stop_grace(h: Harness) -> None:
    await h.agent("node1")
    await h.supervisor(
        "node1", "--nodes", "1", "--preflight", "none", "--stop-grace", "1", env={"RANK_MODE": "ignore_term"}
    )
    g0 = await h.wait_record(0, 0)
    await h.wait_sup("node1", generation=0, state="running")
    await h.restart(1, ["node1"])
    await h.wait_record(1, 0)
    assert not alive(g0["pid"])
    assert "ranks of generation 0 still alive 1.0 s after SIGTERM: SIGKILL" in h.logs()
