"""Issue #20's "Done when": an operator's ordinary day on real parts, end to end.

The installation (:mod:`tests.e2e.operator_stack`): Mosquitto with the shipped config, ACL and mutual
TLS (certificates from ``scripts/make-certs.sh``); a one-host Slurm with three nodes that really run
jobs (node-3 is the spare, ``Weight=1`` so a job with no node list lands there); one ``ftd agent`` per
node and ``ftd coordinator`` from ``examples/config/*.toml`` with only the documented edits (broker,
certificates, node, paths, the API port; ``[agent.heartbeat] timeout_s`` short, an option
``check-config --explain`` lists), each passing ``ftd check-config``. The trainer is the README's
loop, verbatim (:mod:`tests.e2e.readme_trainer` reads it out of README.md when it runs), as a torch
DDP job on gloo, one rank per node.

The day, in order:

1. **The drill** (docs/operators.md §3, its ``ftd inject`` commands as written, the node's installed
   agent config for ``/etc/ftd/agent.toml``): a test job runs on the spare node; (1) ``dry_run =
   true``, restart the coordinator, inject the Xid 13: ``ftd status`` shows checkpoint_restart as
   dry_run and nothing acts; (2) ``dry_run = false``, restart, inject again: the job saves (acked,
   a checkpoint on disk), stops and restarts in place (``RUNNING Restarts=1``, no ``ExcNodeList``)
   from that step, ``ftd status`` shows it succeeded with the node online and not drained; then the
   section's hardware-fault drill (the same command with code 79): saved, node-3 drained with ftd's
   reason in ``sinfo -R``, the job requeued elsewhere and training from its save; ``scontrol update
   nodename=node-3 state=resume`` gives the node back.
2. **Xid 13** (an application fault) in node-1's kernel log while the main job (node-1, node-2)
   trains: every rank saves and acks, the job restarts in place (same job id, ``Restarts=1``) and
   trains again from that step; **the same Xid again 30 s later**: a new occurrence, restarted
   again (``Restarts=2``, after the crash-loop backoff) and training from the new checkpoint.
3. **Agent restarts** on every node of the running job at once (``systemctl restart``: SIGTERM, then
   start): nothing happens to the job.
4. **A slow start-up**: a job whose first step after ``Client()`` takes longer than the agent's
   heartbeat timeout is not reported hung or restarted.

Afterwards: the main job is RUNNING and training from its last saved step; no stale directive reached
a new run (each run received exactly its own save and stop, and no directive id reached two runs); no
healthy node was excluded (``ExcNodeList`` empty, no node drained); no save was lost (every save a
rank received was answered with a checkpoint on disk, every checkpoint_restart succeeded).

Every expectation is checked and recorded; the test fails at the end with the list of those that did
not hold, each with what was seen (a later phase still runs when an earlier one failed, so one run
reports every finding).
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.daemons import REPO
from tests.e2e.operator_stack import OperatorStack, operator_stack, wait_for
from tests.e2e.readme_trainer import readme_loop

pytest.importorskip("torch", reason="the README trainer is a torch DDP job (pip install 'ftd-daemon[torch]')")

pytestmark = [pytest.mark.real, pytest.mark.slow]

HEARTBEAT_TIMEOUT_S = 8.0  # generous: a loaded 2-core machine stalls a rank for seconds
XID13 = (
    "[ {ts}] NVRM: Xid (PCI:0000:3b:00): 13, pid=31337, name=python, Graphics SM Warp Exception "
    "on (GPC 0, TPC 0, SM 0): Out Of Range Address"
)
OPERATORS = REPO / "docs" / "operators.md"


class Findings:
    """Expectations checked along the day; the failed ones, with what was seen, end the test."""

    def __init__(self) -> None:
        self.failed: list[str] = []
        self.passed: list[str] = []

    def check(self, ok: bool, what: str, seen: object = "") -> bool:
        (self.passed if ok else self.failed).append(what if ok else f"{what}: {seen}")
        print(("PASS " if ok else "FAIL ") + what + ("" if ok else f" -- {seen}"), flush=True)
        return ok


def drill_commands(agent_config: Path) -> list[list[str]]:
    """operators.md §3's ``ftd inject`` commands as written (continuation lines joined; ``sudo``
    dropped: the test runs as root), with the documented edit: the node's installed agent config."""
    section = OPERATORS.read_text().split("## 3. The first drill", 1)[1].split("\n## 4.", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, flags=re.S)
    assert block, "docs/operators.md §3 has no sh block"
    commands = []
    for line in block.group(1).replace("\\\n", " ").splitlines():
        argv = shlex.split(line, comments=True)
        if argv[:1] == ["sudo"]:
            argv = argv[1:]
        if argv[:2] == ["ftd", "inject"]:
            commands.append([str(agent_config) if a == "/etc/ftd/agent.toml" else a for a in argv[1:]])
    return commands


def not_excluded(info: dict[str, str]) -> bool:
    return info.get("ExcNodeList", "") in ("", "(null)")


def first_node(info: dict[str, str]) -> str:
    nodes = info.get("NodeList", "")
    m = re.match(r"(node-)\[?(\d+)", nodes)
    assert m, nodes
    return f"{m.group(1)}{m.group(2)}"


def runs(stack: OperatorStack, job: str) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for record in stack.records(job):
        out.setdefault(record["run"], []).append(record)
    return out


def training_in_run(stack: OperatorStack, job: str, run: int, beyond: int, ranks: int) -> bool:
    """Every rank of ``run`` trained a step past ``beyond``."""
    steps = [r for r in stack.records(job, "step") if r["run"] == run and r["step"] > beyond]
    return len({r["rank"] for r in steps}) == ranks


def restarts(stack: OperatorStack, job: str) -> int:
    return int(stack.job(job).get("Restarts", "0"))


def directive_ids(stack: OperatorStack, job: str) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for r in stack.records(job, "directive"):
        out.setdefault(r["run"], set()).add(r["id"])
    return out


@pytest.fixture
def day(tmp_path: Path) -> Iterator[OperatorStack]:
    with operator_stack(
        tmp_path,
        nodes=3,
        cpus={"node-1": 2, "node-2": 2, "node-3": 1},
        weights={"node-3": 1},
        heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,
        save_deadline_s=30,
        stop_deadline_s=30,
    ) as stack:
        yield stack


def test_the_readme_loop_is_in_the_readme() -> None:
    loop = readme_loop()
    assert "client = Client()" in loop and "client.ack_saved(step, save_checkpoint(step))" in loop
    assert len(drill_commands(Path("/x.toml"))) == 2, "operators.md §3: a shadow and a real inject"


@pytest.mark.timeout(1200)  # about 3 minutes when every expectation holds; each failed wait adds its bound
def test_an_operators_day(day: OperatorStack) -> None:
    f = Findings()
    t0 = time.monotonic()

    # -- start of day: a test job on the spare node, then the main job -------------------------
    drill_job = day.submit("drill", 1)
    assert wait_for(lambda: day.last_step(drill_job) >= 10, 120), (
        f"drill job never trained: {day.job(drill_job)}"
    )
    assert day.job(drill_job).get("NodeList") == "node-3", day.job(drill_job)
    main = day.submit("main", 2)
    assert wait_for(lambda: day.last_step(main) >= 20, 120), f"main job never trained: {day.job(main)}"
    main_nodes = day.job(main).get("NodeList")
    assert main_nodes == "node-[1-2]", day.job(main)

    # -- 1. the drill, operators.md §3, its commands as written --------------------------------
    shadow_cmd, real_cmd = drill_commands(day.config(day.agents["node-3"]))
    status_cmd = ["status", "--config", str(day.config(day.coordinator))]  # the API port is edited
    day.restart_coordinator(dry_run=True)
    shadow = day.ftd(*shadow_cmd)
    f.check(shadow.returncode == 0, "drill 1: ftd inject exits 0", shadow.stdout + shadow.stderr)
    wait_for(lambda: "checkpoint_restart" in {a["kind"] for a in day.actions()}, 30)
    status = day.ftd(*status_cmd).stdout
    f.check(
        any("checkpoint_restart" in line and " dry_run " in line for line in status.splitlines()),
        "drill 1: ftd status shows checkpoint_restart as dry_run",
        status,
    )
    time.sleep(10)  # anything the shadow drill set off would act within this
    acted = [a for a in day.actions() if a["state"] != "dry_run"]
    f.check(not acted, "drill 1 (dry run): no action acted", acted)
    f.check(restarts(day, drill_job) == 0 and restarts(day, main) == 0, "drill 1: no job restarted")

    day.restart_coordinator(dry_run=False)
    real = day.ftd(*real_cmd)
    f.check(real.returncode == 0, "drill 2: ftd inject exits 0", real.stdout + real.stderr)
    f.check(
        wait_for(lambda: any(r["run"] == 0 for r in day.records(drill_job, "saved")), 60),
        "drill 2: the test job saved (ack with a checkpoint)",
        day.records(drill_job, "directive"),
    )
    drill_step = max((r["step"] for r in day.records(drill_job, "saved") if r["run"] == 0), default=None)
    f.check(
        wait_for(lambda: training_in_run(day, drill_job, 1, drill_step or 0, 1), 120),
        "drill 2: restarted in place and training again",
        (day.job(drill_job), day.records(drill_job, "directive")),
    )
    info = day.job(drill_job)
    f.check(
        info.get("JobState") == "RUNNING"
        and info.get("Restarts") == "1"
        and not_excluded(info)
        and info.get("NodeList") == "node-3",
        "drill 2: scontrol show job: RUNNING Restarts=1 on node-3, no ExcNodeList",
        info,
    )
    resumed = [r["step"] for r in day.records(drill_job, "resumed") if r["run"] == 1]
    f.check(
        drill_step is not None and resumed == [drill_step], "drill 2: resumed from the drill's save", resumed
    )
    # The restart reads "running: waiting for the job to train again" until the coordinator has seen
    # a rank of the new run register (operators.md §3), then "succeeded": look as an operator would.
    shown = {"status": ""}

    def restart_succeeded() -> bool:
        shown["status"] = status = day.ftd(*status_cmd).stdout
        return any("checkpoint_restart" in line and " succeeded " in line for line in status.splitlines())

    status_ok = wait_for(restart_succeeded, 60, poll=1.0)
    status = shown["status"]
    f.check(
        status_ok and re.search(r"^node-3\s+online\s+no\s", status, flags=re.M) is not None,
        "drill 2: ftd status: checkpoint_restart succeeded, node-3 online and not drained",
        status,
    )

    # The hardware-fault drill of the same section: Xid 79 drains the spare and moves the job.
    hw_cmd = [arg.replace('"code": 13', '"code": 79') for arg in real_cmd]
    hw = day.ftd(*hw_cmd)
    f.check(hw.returncode == 0, "drill xid 79: ftd inject exits 0", hw.stdout + hw.stderr)
    f.check(
        wait_for(lambda: any(r["run"] == 1 for r in day.records(drill_job, "saved")), 60),
        "drill xid 79: the test job saved (ack with a checkpoint)",
        (day.records(drill_job, "directive"), day.actions()[-2:]),
    )
    hw_step = max((r["step"] for r in day.records(drill_job, "saved") if r["run"] == 1), default=None)
    f.check(
        wait_for(lambda: "DRAIN" in day.slurm.node("node-3").get("State", ""), 60),
        "drill xid 79: node-3 drained",
        day.slurm.node("node-3").get("State"),
    )
    reasons = day.slurm.run("sinfo", "-R", "-h", "-o", "%N|%E").stdout
    f.check(
        "node-3|ftd: drill: xid 79 gpu 0000:3b:00.0" in reasons,  # a drill says so, in the drain reason too
        "drill xid 79: sinfo -R shows ftd's reason, marked as a drill",
        reasons,
    )
    f.check(
        wait_for(lambda: training_in_run(day, drill_job, 2, hw_step or 0, 1), 120),
        "drill xid 79: requeued and training again",
        day.job(drill_job),
    )
    resumed = [r["step"] for r in day.records(drill_job, "resumed") if r["run"] == 2]
    f.check(hw_step is not None and resumed == [hw_step], "drill xid 79: resumed from its save", resumed)
    f.check(
        day.job(drill_job).get("NodeList") != "node-3", "drill xid 79: requeued elsewhere", day.job(drill_job)
    )
    f.check(restarts(day, main) == 0, "drill: the main job was not touched", day.job(main))
    day.slurm.run("scontrol", "update", "nodename=node-3", "state=resume")
    f.check(
        wait_for(lambda: "DRAIN" not in day.slurm.node("node-3").get("State", ""), 30),
        "drill: node-3 given back (scontrol update state=resume)",
    )
    drill_directives = {
        run: sorted(r["action"] for r in day.records(drill_job, "directive") if r["run"] == run)
        for run in (0, 1, 2)
    }
    f.check(
        drill_directives == {0: ["save", "stop"], 1: ["save", "stop"], 2: []},
        "drill: each run of the test job received exactly its own save and stop",
        drill_directives,
    )
    day.slurm.run("scancel", drill_job)
    wait_for(lambda: day.job(drill_job).get("JobState") == "CANCELLED", 30)
    print(f"drill done at +{time.monotonic() - t0:.0f}s", flush=True)

    # -- 2. Xid 13, and the same Xid again 30 s later -----------------------------------------
    node = first_node(day.job(main))
    day.kernel(node, XID13.format(ts="6110.203311"))
    xid1 = time.monotonic()
    f.check(
        wait_for(lambda: {r["rank"] for r in day.records(main, "saved") if r["run"] == 0} == {0, 1}, 60),
        "xid 13: every rank of run 0 saved",
        day.records(main, "directive"),
    )
    save1 = max((r["step"] for r in day.records(main, "saved") if r["run"] == 0), default=None)
    f.check(
        wait_for(lambda: training_in_run(day, main, 1, save1 or 0, 2), 120),
        "xid 13: restarted in place and run 1 trains",
        (day.job(main), [r for r in day.records(main) if r["what"] in ("exit", "directive", "resumed")]),
    )
    time.sleep(8)  # a stale stop would reach the new run within this
    f.check(
        not [r for r in day.records(main, "directive") if r["run"] == 1],
        "xid 13: run 1 received no directive (nothing stale)",
        [r for r in day.records(main, "directive") if r["run"] == 1],
    )
    f.check(
        restarts(day, main) == 1 and day.job(main).get("JobState") == "RUNNING",
        "xid 13: Restarts=1, RUNNING",
        day.job(main),
    )
    wait_for(lambda: time.monotonic() - xid1 >= 30, 60)
    day.kernel(node, XID13.format(ts="6140.551204"))
    print(f"second xid 13 {time.monotonic() - xid1:.0f}s after the first", flush=True)
    f.check(
        wait_for(lambda: {r["rank"] for r in day.records(main, "saved") if r["run"] == 1} == {0, 1}, 120),
        "xid 13 again: every rank of run 1 saved",
        day.records(main, "directive"),
    )
    save2 = max((r["step"] for r in day.records(main, "saved") if r["run"] == 1), default=None)
    f.check(
        wait_for(lambda: training_in_run(day, main, 2, save2 or 0, 2), 120),
        "xid 13 again: restarted in place and run 2 trains",
        (day.job(main), day.actions()[-3:]),
    )
    print(f"xid 13 done at +{time.monotonic() - t0:.0f}s", flush=True)

    # -- 3. systemctl restart ftd-agent on every node of the running job ----------------------
    target = main
    if not f.check(
        day.job(main).get("JobState") == "RUNNING",
        "agent restarts: the main job is running when they start",
        day.job(main).get("JobState"),
    ):  # an earlier phase lost it: a fresh job, so that this phase still says what it has to say
        target = day.submit("main-again", 2)
        assert wait_for(lambda: day.last_step(target) >= 20, 120), f"never trained: {day.job(target)}"
    nodes = day.slurm.run("scontrol", "show", "hostnames", day.job(target)["NodeList"]).stdout.split()
    before = (restarts(day, target), len(day.actions()))
    day.restart_agents(nodes)
    restarted_at = day.last_step(target)
    f.check(
        wait_for(lambda: day.last_step(target) > restarted_at + 100, 90),
        f"agent restarts ({', '.join(nodes)}): the job keeps training",
        day.job(target),
    )
    time.sleep(5)
    new_actions = day.actions()[before[1] :]
    f.check(not new_actions, "agent restarts: no action taken", new_actions)
    f.check(restarts(day, target) == before[0], "agent restarts: the job was not restarted", day.job(target))
    f.check(
        not_excluded(day.job(target)), "agent restarts: no node excluded", day.job(target).get("ExcNodeList")
    )
    print(f"agent restarts done at +{time.monotonic() - t0:.0f}s", flush=True)

    # -- 4. a torch job whose start-up outlasts the heartbeat timeout -------------------------
    slow = day.submit("slow-start", 1, env={"FTD_DAY_STARTUP_S": str(HEARTBEAT_TIMEOUT_S * 2.5)})
    f.check(
        wait_for(lambda: day.last_step(slow) >= 30, 150),
        "slow start-up: the job trains",
        (day.job(slow), day.records(slow)[-3:]),
    )
    lost = [
        e for e in day.events("rank_heartbeat_lost") if e.get("job") == slow or e["data"].get("job") == slow
    ]
    f.check(not lost, "slow start-up: no rank reported lost", lost)
    f.check(restarts(day, slow) == 0, "slow start-up: not restarted", day.job(slow))
    print(f"slow start-up done at +{time.monotonic() - t0:.0f}s", flush=True)

    # -- afterwards ---------------------------------------------------------------------------
    info = day.job(main)
    by_run = runs(day, main)
    last_run = max(by_run)
    f.check(info.get("JobState") == "RUNNING", "end: the main job is RUNNING", info)
    saved_steps = sorted({r["step"] for r in day.records(main, "saved") if r["run"] < last_run})
    last_resumed = {r["step"] for r in day.records(main, "resumed") if r["run"] == last_run}
    f.check(
        bool(saved_steps) and last_resumed == {saved_steps[-1]},
        "end: training from the last saved step",
        (saved_steps, last_resumed, last_run),
    )
    f.check(
        training_in_run(day, main, last_run, max(last_resumed, default=0) + 50, 2),
        "end: the last run trained 50 steps past its resume",
    )
    ids = directive_ids(day, main)
    stale = {
        rid for r, these in ids.items() for rid in these if any(rid in o for q, o in ids.items() if q != r)
    }
    f.check(not stale, "end: no directive reached two runs", stale)
    per_run = {
        run: sorted((r["rank"], r["action"]) for r in day.records(main, "directive") if r["run"] == run)
        for run in by_run
    }
    one_restart = [(0, "save"), (0, "stop"), (1, "save"), (1, "stop")]
    f.check(
        per_run == {0: one_restart, 1: one_restart, 2: []},
        "end: each run received exactly its own save and stop (runs 0 and 1), none in run 2",
        per_run,
    )
    for job in sorted({main, slow, target}):
        f.check(
            not_excluded(day.job(job)), f"end: job {job} excludes no node", day.job(job).get("ExcNodeList")
        )
    for name in ("node-1", "node-2", "node-3"):
        state = day.slurm.node(name).get("State", "")
        f.check("DRAIN" not in state, f"end: {name} not drained", state)
    unanswered = []
    for job in sorted({main, drill_job, slow, target}):
        for d in day.records(job, "directive"):
            if d["action"] != "save":
                continue
            acked = [
                s
                for s in day.records(job, "saved")
                if s["pid"] == d["pid"] and s["t"] >= d["t"] and Path(s["path"]).exists()
            ]
            if not acked:
                unanswered.append(d)
    f.check(
        not unanswered,
        "end: every save directive a rank received was answered with a checkpoint on disk",
        unanswered,
    )
    restarts_done = [
        a for a in day.actions() if a["kind"] == "checkpoint_restart" and a["state"] != "dry_run"
    ]
    f.check(
        len(restarts_done) == 4 and all(a["state"] == "succeeded" for a in restarts_done),
        "end: four checkpoint_restarts (drill xid 13 and 79, the main job's xid 13 twice), all succeeded",
        [
            (a["target"], a["state"], a["detail"].get("reason") or a["request"].get("reason"))
            for a in restarts_done
        ],
    )
    coordinator_log = day.coordinator.log()
    f.check("save_incomplete" not in coordinator_log, "end: no save_incomplete in the coordinator's log")
    print(
        f"day done at +{time.monotonic() - t0:.0f}s; {len(f.passed)} held, {len(f.failed)} failed", flush=True
    )
    assert not f.failed, "\n".join(["expectations that did not hold:", *f.failed])
