"""The agent's condition book (what ``ftd health`` reports), the Slurm hooks' parsing of what Slurm
tells them and of ``/proc``, and the coordinator's record of a job without the client (issue #12)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftd.agent.conditions import HARDWARE_KINDS, ConditionBook
from ftd.commands import health
from ftd.commands.slurm_hooks import gpus_from_env, job_processes, job_start_message, tasks_from_env
from ftd.coordinator.model.state import ClusterState
from ftd.events import JobAllocation, JobPresence, Kind, RankInfo, Severity, make_event

PCI = "0000:3b:00.0"


def test_a_critical_event_opens_a_condition_and_its_resolution_closes_it(tmp_path: Path) -> None:
    book = ConditionBook(tmp_path / "c.json", boot="boot-1")
    assert (
        book.observe(make_event("node-1", Kind.XID, severity="error", data={"code": 13, "pci": PCI})) is False
    )
    assert book.observe(make_event("node-1", Kind.XID, severity="critical", data={"code": 79, "pci": PCI}))
    assert [(c.key, c.reason) for c in book.active()] == [(f"xid:{PCI}", f"xid 79 on {PCI}")]
    # another GPU's reset does not resolve it; this GPU's does
    other = {"result": "reset_ok", "pci": "0000:5e:00.0"}
    assert book.observe(make_event("node-1", Kind.GPU_HEALTH, severity="info", data=other)) is False
    assert len(book.active()) == 1
    ok = {"result": "reset_ok", "pci": PCI}
    assert book.observe(make_event("node-1", Kind.GPU_HEALTH, severity="info", data=ok))
    assert book.active() == []


def test_fs_fill_clears_on_its_level_and_is_not_saved(tmp_path: Path) -> None:
    book = ConditionBook(tmp_path / "c.json", boot="b")
    full = {"path": "/scratch", "level": "critical", "used_pct": 97.5}
    book.observe(make_event("node-1", Kind.FS_FILL, severity="critical", data=full))
    book.observe(
        make_event("node-1", Kind.GPU_MISSING, severity="critical", data={"expected": 8, "found": 7})
    )
    assert sorted(c.key for c in book.active()) == ["fs_fill:/scratch", "gpu_missing:node"]
    again = ConditionBook(tmp_path / "c.json", boot="b")  # an agent restart: the fs watcher re-reports
    assert [c.reason for c in again.active()] == ["gpu missing: 7 of 8 GPUs"]
    assert ConditionBook(tmp_path / "c.json", boot="rebooted").active() == []  # a reboot clears
    book.observe(make_event("node-1", Kind.FS_FILL, severity="warning", data={**full, "level": "warning"}))
    assert [c.key for c in book.active()] == ["gpu_missing:node"]


def test_a_watcher_that_cannot_watch_is_a_condition_until_it_can_and_a_restart_re_reports_it(
    tmp_path: Path,
) -> None:
    # issue #32 item 3: NVML broken on a node with GPUs (the NVML watcher's agent_health event)
    book = ConditionBook(tmp_path / "c.json", boot="b")
    why = "nvml unavailable on a node with NVIDIA GPUs (dev/nvidia0): nvmlInit failed"
    broken = {"problem": "watcher_unavailable", "watcher": "nvml", "reason": why}
    restart = {"problem": "watcher_restart", "watcher": "fs", "reason": "boom"}
    assert book.observe(make_event("node-1", Kind.AGENT_HEALTH, severity="error", data=restart)) is False
    assert book.observe(make_event("node-1", Kind.AGENT_HEALTH, severity="error", data=broken))
    assert [(c.key, c.reason) for c in book.active()] == [("agent_health:nvml", why)]
    assert ConditionBook(tmp_path / "c.json", boot="b").active() == []  # not saved: re-reported at start
    back = {"problem": "watcher_available", "watcher": "nvml", "reason": "nvml works again"}
    assert book.observe(make_event("node-1", Kind.AGENT_HEALTH, severity="info", data=back))
    assert book.active() == []


def test_leftover_gpu_processes_last_while_they_live(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "4242").mkdir(parents=True)
    book = ConditionBook(None, boot="b", proc_root=str(proc))
    data = {"job": "77", "pids": [4242, 4243], "gpu_pids": [4242]}
    assert book.observe(make_event("node-1", Kind.JOB_LEFTOVER, severity="error", data=data))
    assert [c.reason for c in book.active()] == ["job 77 left GPU processes 4242"]
    (proc / "4242").rmdir()
    assert book.active() == []
    no_gpu = {"job": "78", "pids": [1], "gpu_pids": []}
    assert book.observe(make_event("node-1", Kind.JOB_LEFTOVER, severity="warning", data=no_gpu)) is False


def test_a_passing_preflight_clears_hardware_conditions_only(tmp_path: Path) -> None:
    book = ConditionBook(None, boot="b")
    book.observe(make_event("node-1", Kind.XID, severity="critical", data={"code": 79, "pci": PCI}))
    book.observe(
        make_event("node-1", Kind.FS_FILL, severity="critical", data={"path": "/x", "level": "critical"})
    )
    assert book.clear_all(why="preflight passed", kinds=HARDWARE_KINDS) == [f"xid:{PCI}"]
    assert [c.kind for c in book.active()] == ["fs_fill"]


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])  # slow only on a loaded machine
@given(
    st.dictionaries(
        st.sampled_from(["code", "pci", "uuid", "path", "job", "level", "signal"]),
        st.integers() | st.text() | st.none(),
    ),
    st.sampled_from(list(Kind)),
    st.sampled_from(list(Severity)),
)
def test_any_event_data_is_folded_without_raising(
    data: dict[str, object], kind: Kind, severity: Severity
) -> None:
    book = ConditionBook(None, boot="b", proc_root="/nonexistent")
    book.observe(make_event("node-1", kind, severity=severity, data=data))
    for cond in book.active():
        assert isinstance(cond.reason, str)


def test_what_slurm_tells_the_prolog() -> None:
    env = {
        "SLURM_JOB_ID": "1234",
        "SLURM_JOB_USER": "alice",
        "SLURM_JOB_UID": "1000",
        "SLURM_JOB_GPUS": "0,1,3",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "SLURM_JOB_PARTITION": "gpu",
        "SLURM_TASKS_PER_NODE": "4(x2)",
    }
    msg = job_start_message(env)
    assert msg == {
        "v": 1,
        "op": "job_start",
        "job": "1234",
        "user": "alice",
        "uid": 1000,
        "gpus": ["0", "1", "3"],
        "tasks": 4,
        "partition": "gpu",
    }
    assert gpus_from_env({"CUDA_VISIBLE_DEVICES": "2, 3"}) == ["2", "3"]
    assert gpus_from_env({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}) == []
    assert tasks_from_env({}) is None
    assert job_start_message({}) is None


def _proc(
    root: Path, pid: int, ppid: int, env: bytes, comm: str = "sleep", cmdline: bytes = b"sleep\0"
) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "stat").write_text(f"{pid} ({comm}) S {ppid} 1 1 0")
    (d / "environ").write_bytes(env)
    (d / "comm").write_text(comm + "\n")
    (d / "cmdline").write_bytes(cmdline)


def test_leftover_processes_are_the_jobs_except_the_hook_and_slurmstepd(tmp_path: Path) -> None:
    job = b"SLURM_JOB_ID=55\0HOME=/root\0"
    _proc(tmp_path, 10, 1, b"", comm="slurmd")  # slurmd, the epilog's parent
    _proc(tmp_path, 20, 10, job, comm="epilog.sh")  # the epilog (carries the job's environment)
    _proc(tmp_path, 21, 20, job, comm="python")  # the hook itself
    _proc(tmp_path, 22, 21, job, comm="nvidia-smi")  # a child of the hook
    _proc(tmp_path, 30, 1, job, comm="python")  # escaped from the job: leftover
    _proc(tmp_path, 31, 1, b"SLURM_JOB_ID=555\0", comm="python")  # another job
    _proc(tmp_path, 40, 1, job, comm="slurmstepd", cmdline=b"slurmstepd: [55.batch]\0")
    found = job_processes("55", proc_root=str(tmp_path), me=21)
    assert [(p["pid"], p["name"]) for p in found] == [(30, "python")]


def test_health_reason_is_one_safe_line() -> None:
    text = health.sanitize('xid 79 "quoted"\nsecond\\line' + "x" * 400)
    assert text.startswith("ftd: health: xid 79 'quoted' second line")
    assert len(text) == 200 and '"' not in text and "\\" not in text and "\n" not in text


def test_the_coordinator_knows_a_job_from_its_allocation_alone() -> None:
    state = ClusterState()
    alloc = JobAllocation(user="alice", gpus=["0"])
    state.apply_presence("node-1", "9", JobPresence(job="9", node="node-1", allocation=alloc))
    assert state.jobs_on_node("node-1") == ["9"] and state.job_nodes("9") == ["node-1"]
    assert state.jobs["9"].ranks == set()
    # the trainer registers too, then leaves: the allocation keeps the job known until its Epilog
    ranks = [RankInfo(rank=0)]
    state.apply_presence("node-1", "9", JobPresence(job="9", node="node-1", ranks=ranks, allocation=alloc))
    assert state.jobs["9"].ranks == {0}
    state.apply_presence("node-1", "9", JobPresence(job="9", node="node-1", allocation=alloc))
    assert state.jobs["9"].ranks == set() and state.jobs_on_node("node-1") == ["9"]
    state.apply_presence("node-1", "9", None)
    assert "9" not in state.jobs and state.jobs_on_node("node-1") == []
    assert os.path.exists("/proc")  # job_processes reads the real /proc in production


async def test_a_job_whose_epilog_missed_the_agent_is_ended_when_it_is_back(tmp_path: Path) -> None:
    import asyncio
    import contextlib

    from ftd.agent.jobs import JobStartMsg, SchedulerJobs
    from ftd.agent.wiring import build_agent
    from ftd.bus import topics
    from ftd.bus.memory import MemoryBroker, MemoryBus
    from ftd.config import AgentConfig
    from tests.unit.helpers import until

    state = tmp_path / "state"
    before = SchedulerJobs(state / "jobs.json")  # the agent before it went down knew two jobs
    before.start(JobStartMsg(job="77", user="alice"))
    before.start(JobStartMsg(job="78", user="bob"))
    (state / "ended-jobs").mkdir()
    (state / "ended-jobs" / "77").touch()  # 77's Epilog ran while the agent was down
    (tmp_path / "kmsg").touch()
    broker = MemoryBroker()
    watch = MemoryBus(broker, client_id="watch")
    await watch.subscribe(topics.ALL_NODE_JOBS)
    await watch.start()
    cfg = AgentConfig(
        node="n1",
        kmsg_path=str(tmp_path / "kmsg"),
        state_dir=str(state),
        socket_path=str(tmp_path / "a.sock"),
    )
    agent = build_agent(cfg, bus=MemoryBus(broker, client_id="agent"))
    task = asyncio.create_task(agent.run())
    seen: dict[str, bytes] = {}

    async def collect() -> None:
        async for message in watch.messages():
            seen[message.topic] = message.payload

    collector = asyncio.create_task(collect())
    try:
        await until(lambda: topics.node_job("n1", "78") in seen, 10)
        assert agent.scheduler_jobs.get("77") is None and agent.scheduler_jobs.get("78") is not None
        assert b'"user":"bob"' in seen[topics.node_job("n1", "78")]
        assert not seen.get(topics.node_job("n1", "77"))  # 77 is not published as running
        assert not (state / "ended-jobs" / "77").exists()
        assert SchedulerJobs(state / "jobs.json").get("77") is None  # and it stays ended
    finally:
        for t in (task, collector):
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t
        await watch.stop()


@given(st.text(), st.text(), st.text())
def test_hook_env_parsers_take_anything(gpus: str, cuda: str, tasks: str) -> None:
    env = {"SLURM_JOB_GPUS": gpus, "CUDA_VISIBLE_DEVICES": cuda, "SLURM_TASKS_PER_NODE": tasks}
    found = gpus_from_env(env)
    assert all(g and g == g.strip() and "," not in g for g in found)
    count = tasks_from_env(env)
    leading = re.match(r"[0-9]{1,9}", tasks)
    assert count == (int(leading.group()) if leading else None)


@given(st.text(max_size=1000))
def test_a_health_drain_reason_is_always_one_safe_bounded_line(reason: str) -> None:
    text = health.sanitize(reason)
    assert text.startswith("ftd: health: ") and len(text) <= 200
    assert not any(c in text for c in '"\\\n\r\x00')


def test_gpu_processes_left_on_the_jobs_own_gpus_are_found_without_its_environment(tmp_path: Path) -> None:
    from ftd.commands.slurm_hooks import leftovers

    proc = tmp_path / "proc"
    _proc(proc, 50, 1, b"HOME=/\0", comm="python")  # escaped with a cleared environment, on GPU-B
    _proc(proc, 51, 1, b"SLURM_JOB_ID=999\0", comm="python")  # another job's, on GPU-B
    _proc(proc, 52, 1, b"", comm="python")  # on GPU-C: not this job's GPU
    _proc(proc, 53, 1, b"SLURM_JOB_ID=55\0", comm="sleep")  # the job's own, holding no GPU
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        '  --query-gpu=*) printf "0, GPU-A\\n1, GPU-B\\n2, GPU-C\\n" ;;\n'
        '  --query-compute-apps=*) printf "50, GPU-B\\n51, GPU-B\\n52, GPU-C\\n77, GPU-B\\n" ;;\n'
        "esac\n"
    )
    smi.chmod(0o755)
    found = leftovers("55", str(smi), 5.0, proc_root=str(proc), gpus=["1"])
    assert [(p["pid"], p["gpu"]) for p in found] == [(53, None), (50, "GPU-B")]  # 77: no such process
    assert leftovers("55", str(smi), 5.0, proc_root=str(tmp_path / "empty"), gpus=[]) == []


def test_another_clusters_job_with_the_same_id_is_not_a_leftover(tmp_path: Path) -> None:
    """Job ids are per cluster: where two clusters' jobs share a host (or a test machine runs several
    test clusters), job 55 of cluster b is not job 55 of cluster a. CI, 2026-12-04: the epilog of job 2
    counted four processes of another test cluster's job 2."""
    _proc(tmp_path, 30, 1, b"SLURM_JOB_ID=55\0SLURM_CLUSTER_NAME=a\0", comm="python")  # ours, escaped
    _proc(tmp_path, 31, 1, b"SLURM_JOB_ID=55\0SLURM_CLUSTER_NAME=b\0", comm="python")  # b's job 55
    _proc(tmp_path, 32, 1, b"SLURM_JOB_ID=55\0", comm="python")  # no cluster said: cannot tell, ours
    found = job_processes("55", proc_root=str(tmp_path), me=999, cluster="a")
    assert [p["pid"] for p in found] == [30, 32]
    assert [p["pid"] for p in job_processes("55", proc_root=str(tmp_path), me=999)] == [30, 31, 32]
