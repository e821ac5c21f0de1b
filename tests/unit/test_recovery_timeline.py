"""ftd.bench.recovery_timeline: how one recovery is read from the trainers' records (pure)."""

from __future__ import annotations

from typing import Any

from ftd.bench.recovery_timeline import coordinator_view, timeline

FAULT = 1000.0


def rec(
    what: str, t: float, rank: int, *, gen: int = 0, restart: int = 0, pid: int | None = None, **kw: Any
) -> dict[str, Any]:
    return {
        "what": what,
        "t": t,
        "rank": rank,
        "generation": gen,
        "restart": restart,
        "pid": pid if pid is not None else 100 * (restart * 10 + gen + 1) + rank,
        "node": f"node-{rank + 1}",
        **kw,
    }


def gen0_start(rank: int) -> list[dict[str, Any]]:
    """Rank ``rank`` of generation 0 started, met the others, starting from scratch."""
    return [
        rec("process_start", 900.0, rank),
        rec("rendezvous", 901.0, rank, generations=[0, 0, 0], same=True),
        rec("resumed", 901.1, rank, step=0),
    ]


def old_generation(save: int = 30, last: int = 31) -> list[dict[str, Any]]:
    """Three ranks of generation 0 stepping to ``last``, saving ``save`` after the fault, exiting."""
    out: list[dict[str, Any]] = []
    for rank in range(3):
        out += gen0_start(rank)
        for step in range(1, last + 1):
            out.append(rec("step", 990.0 + step * 0.1 - (2.0 if step <= 30 else 0), rank, step=step))
        out.append(rec("saved", 1000.2, rank, step=save))
        out.append(rec("exit", 1000.5 + rank * 0.01, rank, step=last, outcome="stopped"))
    return out


def new_generation(
    *, gen: int = 1, restart: int = 0, resumed: int = 30, start: float = 1001.0, same: bool = True
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for rank in range(3):
        out.append(rec("process_start", start + rank * 0.1, rank, gen=gen, restart=restart, warm=True))
        gens = [gen, gen, gen] if same or rank else [gen - 1, gen, gen]
        out.append(
            rec(
                "rendezvous",
                start + 1,
                rank,
                gen=gen,
                restart=restart,
                generations=gens,
                same=same or rank > 0,
            )
        )
        out.append(rec("resumed", start + 1.1, rank, gen=gen, restart=restart, step=resumed))
        out.append(rec("step", start + 2 + rank * 0.05, rank, gen=gen, restart=restart, step=resumed + 1))
        out.append(rec("step", start + 2.2, rank, gen=gen, restart=restart, step=resumed + 2))
    return out


def test_an_in_allocation_recovery_is_read_exactly() -> None:
    got = timeline(old_generation() + new_generation(), FAULT)
    assert got["old"] == [0, 0] and got["new"] == [0, 1]
    assert got["save_step"] == 30 and got["resumed_from"] == 30 and got["steps_lost"] == 0
    assert got["steps_discarded"] == 1  # step 31 ran after the save, redone after the resume
    assert got["ranks_stopped_s"] == 0.52  # the last old process's last record
    assert got["new_generation_started_s"] == 1.0 and got["all_started_s"] == 1.2
    assert got["first_step"] == 31 and got["first_step_s"] == 3.1  # the slowest rank's step 31
    assert got["ranks"] == 3 and got["old_generation_ranks"] == 0 and got["old_steps_after_new_start"] == 0
    assert got["warm"] == [True]


def test_a_requeue_is_told_apart_by_its_restart_count() -> None:
    got = timeline(old_generation() + new_generation(gen=0, restart=1, start=1008.0), FAULT)
    assert got["new"] == [1, 0] and got["new_generation_started_s"] == 8.0 and got["first_step_s"] == 10.1


def test_resuming_from_an_older_checkpoint_counts_the_lost_steps() -> None:
    got = timeline(old_generation(save=30) + new_generation(resumed=20), FAULT)
    assert got["steps_lost"] == 10


def test_an_old_generation_rank_in_the_new_rendezvous_is_counted() -> None:
    got = timeline(old_generation() + new_generation(same=False), FAULT)
    assert got["old_generation_ranks"] == 1


def test_old_steps_after_the_new_generation_started_are_counted() -> None:
    stray = [rec("step", 1001.5, 2, step=32, pid=102)]  # rank 2 of generation 0 still training
    got = timeline(old_generation() + new_generation() + stray, FAULT)
    assert got["old_steps_after_new_start"] == 1


def test_a_job_that_never_came_back_has_no_figures_not_guesses() -> None:
    got = timeline(old_generation(), FAULT)
    assert got["new"] is None and got["first_step_s"] is None and got["resumed_from"] is None
    assert got["steps_lost"] is None and got["new_generation_started_s"] is None
    assert got["save_step"] == 30


def test_a_first_step_not_yet_done_on_every_rank_is_not_measured() -> None:
    partial = [r for r in new_generation() if not (r["what"] == "step" and r["rank"] == 2)]
    got = timeline(old_generation() + partial, FAULT)
    assert got["first_step_s"] is None


def test_ranks_saving_different_steps_are_shown_not_hidden() -> None:
    records = old_generation()
    next(r for r in records if r["what"] == "saved" and r["rank"] == 1)["step"] = 31
    got = timeline(records + new_generation(), FAULT)
    assert got["save_step"] == [30, 31] and got["steps_lost"] is None


def test_the_coordinator_detail_is_given_relative_to_the_fault() -> None:
    detail = {
        "path": "spare",
        "generation": 1,
        "slots": ["node-1", "node-4", "node-3"],
        "stopped_at": 1000.6,
        "resumed_at": 1004.25,
        "requeued": None,
        "ignored": "x",
    }
    view = coordinator_view(detail, FAULT)
    assert view == {
        "path": "spare",
        "generation": 1,
        "slots": ["node-1", "node-4", "node-3"],
        "requeued": False,
        "stopped_s": 0.6,
        "resumed_s": 4.25,
    }


def killed_rank_generation(every: int = 10, last: int = 34) -> list[dict[str, Any]]:
    """Three ranks checkpointing every ``every`` steps; rank 1 SIGKILLed after step ``last`` (no
    exit, no save after the fault), ranks 0 and 2 failing out of their collective."""
    out: list[dict[str, Any]] = []
    for rank in range(3):
        out += gen0_start(rank)
        for step in range(1, last + 1):
            out.append(rec("step", 996.0 + step * 0.1, rank, step=step))
            if step % every == 0:
                out.append(rec("saved", 996.01 + step * 0.1, rank, step=step, periodic=True))
        if rank != 1:
            out.append(rec("exit", 1000.3, rank, step=last, outcome="timeout"))
    return out


def test_a_killed_rank_resumed_from_the_newest_checkpoint_loses_no_saved_step() -> None:
    got = timeline(killed_rank_generation() + new_generation(resumed=30, start=1002.0), FAULT)
    assert got["save_step"] is None  # no save could gather every rank after the fault
    assert got["newest_checkpoint"] == 30
    assert got["steps_lost"] == 0 and got["steps_redone"] == 4  # steps 31-34 trained again
    assert got["first_step_s"] == 4.1


def test_a_killed_rank_resumed_from_an_older_checkpoint_counts_the_lost_steps() -> None:
    got = timeline(killed_rank_generation() + new_generation(resumed=20, start=1002.0), FAULT)
    assert got["steps_lost"] == 10 and got["steps_redone"] == 14


def test_a_periodic_checkpoint_after_the_fault_is_not_the_agreed_save() -> None:
    records = killed_rank_generation(last=40)  # step 40's periodic checkpoint lands after the fault
    got = timeline(records + new_generation(resumed=40, start=1002.0), FAULT)
    assert got["save_step"] is None and got["newest_checkpoint"] == 40 and got["steps_lost"] == 0


def test_no_checkpoint_at_all_resumes_from_scratch_and_redoes_everything() -> None:
    got = timeline(killed_rank_generation(every=1000) + new_generation(resumed=0, start=1002.0), FAULT)
    assert got["newest_checkpoint"] == 0 and got["steps_lost"] == 0 and got["steps_redone"] == 34


def test_a_checkpoint_on_disk_before_the_kill_counts_though_only_rank_0_recorded_it() -> None:
    """Rank 0 records a periodic checkpoint once it is on disk; a rank killed during the barrier
    after it keeps the others from recording it, and the restart rightly resumes from it."""
    records = [
        r
        for r in killed_rank_generation(last=30)
        if not (r["what"] == "saved" and r["step"] == 30 and r["rank"] != 0)
    ]
    got = timeline(records + new_generation(resumed=30, start=1002.0), FAULT)
    assert got["newest_checkpoint"] == 30 and got["steps_lost"] == 0 and got["steps_redone"] == 0
