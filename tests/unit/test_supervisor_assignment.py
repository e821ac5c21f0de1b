"""The rank supervisor's pure parts (``ftd run``, issue #24): generation 0's slot from options and
the environment, each rank's environment, what a restart directive asks of a node, and the command
line's defaults."""

from __future__ import annotations

import argparse

import pytest

from ftd.supervisor import cli as run_cmd
from ftd.supervisor.assignment import (
    Options,
    Restart,
    SetupError,
    gen0_master_addr,
    initial_role,
    on_restart,
    parse_restart,
    rank_env,
)
from ftd.supervisor.ranks import exit_code_of
from ftd.supervisor.warm import warm_script


def opts(**kw: object) -> Options:
    base: dict[str, object] = {"command": ["python", "train.py"], "nodes": 3, "spares": 1}
    return Options(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("given", "env", "want"),
    [
        ({"node_rank": 2}, {"SLURM_NODEID": "0"}, ("active", 2)),  # the option wins
        ({}, {"SLURM_NODEID": "1"}, ("active", 1)),
        ({}, {"SLURM_NODEID": "3"}, ("spare", None)),  # index >= nodes: a spare
        ({}, {"JOB_COMPLETION_INDEX": "0"}, ("active", 0)),  # a Kubernetes indexed Job
        ({}, {"JOB_COMPLETION_INDEX": "5"}, ("spare", None)),
        ({"nodes": 1, "spares": 0}, {}, ("active", 0)),  # one node: no index needed
    ],
)
def test_generation_0_slot(
    given: dict[str, object], env: dict[str, str], want: tuple[str, int | None]
) -> None:
    assert initial_role(opts(**given), env) == want


def test_generation_0_without_an_index_or_with_a_bad_one_is_a_clear_error() -> None:
    with pytest.raises(SetupError, match="--node-rank"):
        initial_role(opts(), {})
    with pytest.raises(SetupError, match="SLURM_NODEID='x'"):
        initial_role(opts(), {"SLURM_NODEID": "x"})


def test_generation_0_master_addr_order() -> None:
    assert gen0_master_addr(opts(master_addr="a"), {"MASTER_ADDR": "b"}, "c") == "a"
    assert gen0_master_addr(opts(), {"MASTER_ADDR": "b"}, "c") == "b"
    assert gen0_master_addr(opts(), {}, "c") == "c"
    assert gen0_master_addr(opts(addr="me"), {}, None) == "me"


def test_rank_env_of_a_generation() -> None:
    o = opts(nproc=4, job="77", master_port=29500, socket="/run/n2.sock")
    env = rank_env(o, generation=3, slot=2, local_rank=1, master_addr="10.0.0.5", resume_step=1200)
    assert env == {
        "RANK": "9",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "12",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "2",
        "MASTER_ADDR": "10.0.0.5",
        "MASTER_PORT": "29503",
        "FTD_RUN": "gen-3",
        "FTD_GENERATION": "3",
        "FTD_TERM_WAIT_S": "0",  # ftd run ends its ranks itself: no wait for Slurm at exit
        "FTD_JOB_ID": "77",
        "FTD_JOB": "77",
        "FTD_SOCKET": "/run/n2.sock",
        "FTD_RESUME_STEP": "1200",
    }
    requeued = rank_env(
        opts(run="slurm-restart-1"), generation=0, slot=0, local_rank=0, master_addr="h", resume_step=None
    )
    assert requeued["FTD_RUN"] == "slurm-restart-1.gen-0"  # not the run before the requeue's gen-0
    bare = rank_env(opts(), generation=0, slot=0, local_rank=0, master_addr="h", resume_step=None)
    assert "FTD_RESUME_STEP" not in bare and "FTD_JOB_ID" not in bare and "FTD_SOCKET" not in bare


def restart(gen: int = 2, slots: list[str] | None = None, out: list[str] | None = None) -> Restart:
    return Restart(gen, slots or ["n1", "n4", "n3"], "h", 10, out or ["n2"], "spare")


def test_what_a_restart_asks_of_each_node() -> None:
    assert on_restart(restart(), "n4", acted=1) == ("active", 1)
    assert on_restart(restart(), "n2", acted=1) == ("out", None)
    assert on_restart(restart(), "n5", acted=1) == ("spare", None)
    assert on_restart(restart(), "n4", acted=2) == ("ignore", None)  # a re-send of the same generation
    assert on_restart(restart(), "n4", acted=5) == ("ignore", None)  # an older one
    # A restart sent to the job's run before a scheduler requeue, delivered to the requeued run's
    # supervisor (same job, same node, generation 0 again): ignored; one for its own run is not.
    stale = Restart(1, ["n1", "n4"], "h", 10, [], "spare", {"n4": "slurm-restart-0", "n1": "slurm-restart-0"})
    assert on_restart(stale, "n4", acted=0, run="slurm-restart-1") == ("ignore", None)
    assert on_restart(stale, "n4", acted=0, run="slurm-restart-0") == ("active", 1)
    assert on_restart(stale, "n9", acted=0, run="slurm-restart-1") == ("spare", None)  # not named: unknown
    assert on_restart(stale, "n4", acted=0) == ("active", 1)  # a supervisor that knows no run of its own


def test_restart_params_are_checked() -> None:
    good = {
        "generation": 2,
        "slots": ["a", "b"],
        "master_addr": "a",
        "resume_step": 5,
        "out": ["c"],
        "path": "spare",
    }
    assert parse_restart(good) == Restart(2, ["a", "b"], "a", 5, ["c"], "spare")
    assert parse_restart({**good, "resume_step": None, "out": None}) == Restart(
        2, ["a", "b"], "a", None, [], "spare"
    )
    assert parse_restart({**good, "generation": True}) == "generation True is not a non-negative integer"
    assert parse_restart({**good, "slots": []}) == "slots [] is not a list of node names"
    assert parse_restart({**good, "master_addr": ""}) == "master_addr '' is not an address"
    assert parse_restart({**good, "resume_step": "5"}) == "resume_step '5' is not an integer"
    assert parse_restart({**good, "runs": {"a": "slurm-restart-1"}}) == Restart(
        2, ["a", "b"], "a", 5, ["c"], "spare", {"a": "slurm-restart-1"}
    )
    assert parse_restart({**good, "runs": ["a"]}) == "runs ['a'] is not a map of node names to runs"


def test_exit_codes_and_the_warm_form() -> None:
    assert exit_code_of(3) == 3 and exit_code_of(-9) == 137
    assert warm_script(["python3", "train.py", "--lr", "1"]) == "train.py"
    assert warm_script(["/venv/bin/python", "-u", "train.py"]) is None
    assert warm_script(["torchrun", "train.py"]) is None


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    run_cmd.register(parser.add_subparsers())
    return parser.parse_args(["run", *argv])


def test_command_line_defaults_from_slurm() -> None:
    env = {"SLURM_NNODES": "4", "SLURM_JOB_ID": "99", "SLURMD_NODENAME": "node-3", "FTD_SOCKET": "/s"}
    o = run_cmd.options(parse("--spares", "1", "--", "python", "t.py"), env)
    assert (o.nodes, o.spares, o.job, o.node, o.socket, o.command) == (
        3,
        1,
        "99",
        "node-3",
        "/s",
        ["python", "t.py"],
    )
    assert o.preflight == "ftd preflight"
    assert o.run == "slurm-restart-0"  # the job's first run
    requeued = run_cmd.options(parse("--spares", "1", "--", "t"), {**env, "SLURM_RESTART_COUNT": "2"})
    assert requeued.run == "slurm-restart-2"
    assert run_cmd.options(parse("--nodes", "2", "--", "t"), {"FTD_JOB": "j7"}).job == "j7"  # the client's
    assert run_cmd.options(parse("--nodes", "2", "--", "t"), {"FTD_POD_UID": "u1"}).run == "pod-u1"
    o = run_cmd.options(
        parse("--nodes", "2", "--preflight", "none", "--warm", "torch, numpy", "python", "t.py"), {}
    )
    assert (o.nodes, o.preflight, o.warm, o.job, o.run) == (2, None, ["torch", "numpy"], None, "")


def test_command_line_mistakes_are_clear_errors() -> None:
    with pytest.raises(SetupError, match="no training command"):
        run_cmd.options(parse("--nodes", "2"), {})
    with pytest.raises(SetupError, match="SLURM_NNODES not set"):
        run_cmd.options(parse("--", "python", "t.py"), {})
    with pytest.raises(SetupError, match="more nodes than --spares"):
        run_cmd.options(parse("--spares", "2", "--", "python", "t.py"), {"SLURM_NNODES": "2"})
    assert run_cmd.run(parse("--", "python", "t.py"), env={}) == 2
