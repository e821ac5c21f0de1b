"""What a goodput run prints and draws: the policy table, the lost-time explanation, the PNG.

What: :func:`render_text` writes the side-by-side table (ETTR, lost GPU-hours by cause, restarts,
nodes drained, mean time to recover), then, per policy, every percentage point of wall time lost,
by cause and by fault category, then the checkpoint-interval sweep with the Young/Daly optimum.
:func:`plot` draws ETTR against the checkpoint interval per policy (optimum marked) beside a
stacked bar of lost time by cause per policy, with matplotlib's Agg backend (no display needed).

Why: the figure an operator acts on is the percentage of the run lost and to what; the table and
the plot come from the same report dict that ``--json`` prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any

from ftd.sim.goodput.model import CAUSES

CAUSE_LABELS = {
    "checkpoint_overhead": "periodic checkpoint saves",
    "lost_work": "work lost since the last checkpoint",
    "detection": "detection (fault -> job stopped)",
    "save_on_signal": "saves on a signal",
    "restart": "restart (requeue or in the allocation) and checkpoint load",
    "spare_wait": "waiting for a spare node",
}


def _table(rows: list[list[str]], out: IO[str]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        cells = [row[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True))]
        out.write("  ".join(cells).rstrip() + "\n")
        if n == 0:
            out.write("  ".join("-" * w for w in widths) + "\n")


def render_text(report: dict[str, Any], out: IO[str]) -> None:
    mix, params, policies = report["mix"], report["params"], report["policies"]
    out.write(
        f"{mix['title']}\n"
        f"job: {params['job_gpus']} GPUs ({report['nodes']} nodes of {params['gpus_per_node']}), "
        f"{params['spare_nodes']} spare nodes, {params['days']:g} days; "
        f"{report['faults_per_run']:.0f} faults per run (job MTBF {report['job_mtbf_h']:.2f} h); "
        f"seeds {report['seeds'] or 'recorded'}\n"
        f"checkpoint every {params['checkpoint_interval_s']:g} s, save {params['save_s']:g} s, "
        f"load {params['load_s']:g} s, restart {params['restart_s']:g} s, "
        f"NCCL watchdog {params['watchdog_s']:g} s, same bad node back {params['same_node_p']:.0%}\n"
    )
    costs = report.get("restart_costs")
    if params.get("in_allocation") and costs:
        out.write(
            f"ftd run: {params['alloc_spares']} hot spares in the allocation"
            f"{' (warm)' if params['warm_spares'] else ''}, in-allocation restart "
            f"{costs['in_allocation_s']:.1f} s vs requeue {costs['requeue_s']:.0f} s (ftd bench recovery)\n"
        )
    out.write("\n")
    names = list(policies)

    def row(label: str, cell: Any) -> list[str]:
        return [label, *(cell(policies[p]) for p in names)]

    rows = [["", *names], row("ETTR", lambda p: f"{p['ettr']:.2%}")]
    for cause in CAUSES:
        rows.append(row(f"lost GPU-h: {cause}", lambda p, c=cause: f"{p['lost_gpu_hours'][c]:,.0f}"))
    rows += [
        row("lost GPU-h: total", lambda p: f"{sum(p['lost_gpu_hours'].values()):,.0f}"),
        row("restarts", lambda p: f"{p['interruptions']:.1f}"),
        row("  of which bad node again", lambda p: f"{p['recurrences']:.1f}"),
        row("  of which moved before failing", lambda p: f"{p['proactive_moves']:.1f}"),
        row("  of which in the allocation", lambda p: f"{p.get('restarts_in_allocation', 0):.1f}"),
        row("  of which requeued, no spare", lambda p: f"{p.get('restarts_requeued', 0):.1f}"),
        row("hot spares used", lambda p: f"{p.get('spares_used', 0):.1f}"),
        row("saves on a signal", lambda p: f"{p['saves_on_signal']:.1f}"),
        row("nodes drained", lambda p: f"{p['nodes_drained']:.1f}"),
        row("mean time to recover", lambda p: f"{p['mttr_s'] / 60:.1f} min"),
    ]
    _table(rows, out)
    for name in names:
        pol = policies[name]
        out.write(f"\n{name}: {1 - pol['ettr']:.2%} of wall time lost\n")
        for cause in CAUSES:
            share = pol["lost_fraction"][cause]
            if share >= 0.00005:
                out.write(f"  {share:6.2%}  {CAUSE_LABELS[cause]}\n")
        by_cat = sorted(pol["lost_fraction_by_category"].items(), key=lambda kv: -kv[1])
        if by_cat:
            out.write("  by fault category (everything but periodic saves):\n")
            for cat, share in by_cat:
                if share >= 0.00005:
                    out.write(f"  {share:6.2%}  {cat}\n")
        verdicts = [v for v in pol.get("engine_verdicts", []) if v["verdict"] != "allowed"]
        if verdicts:
            held = ", ".join(f"{v['kind']} {v['verdict']} x{v['count']}" for v in verdicts)
            out.write(f"  engine actions not run: {held}\n")
    if report["sweep"]:
        out.write(f"\nETTR by checkpoint interval (Young/Daly optimum {report['young_daly_s']:.0f} s):\n")
        rows = [["interval", *names]]
        nearest = min(report["sweep"], key=lambda p: abs(p["checkpoint_interval_s"] - report["young_daly_s"]))
        for point in report["sweep"]:
            mark = " *" if point is nearest else ""
            rows.append(
                [f"{point['checkpoint_interval_s']:.0f} s{mark}", *(f"{point[p]:.2%}" for p in names)]
            )
        _table(rows, out)
    out.write(f"\n{report['seconds_per_run']:.1f} s per simulated run, {report['elapsed_s']:.1f} s in all\n")


def plot(report: dict[str, Any], path: str | Path) -> Path:
    """Write the PNG (ETTR vs checkpoint interval; lost time by cause); returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = report["policies"]
    names = list(policies)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    if report["sweep"]:
        xs = [p["checkpoint_interval_s"] / 60.0 for p in report["sweep"]]
        for name in names:
            left.plot(xs, [100 * p[name] for p in report["sweep"]], marker="o", label=name)
        left.axvline(report["young_daly_s"] / 60.0, color="grey", linestyle="--", label="Young/Daly optimum")
        left.set_xscale("log")
    else:
        left.text(0.5, 0.5, "no sweep (--no-sweep)", ha="center", va="center", transform=left.transAxes)
    left.set_xlabel("checkpoint interval (min)")
    left.set_ylabel("ETTR (%)")
    left.set_title("ETTR vs checkpoint interval")
    left.grid(True, alpha=0.3)
    left.legend()
    bottom = [0.0] * len(names)
    for cause in CAUSES:
        values = [100 * policies[n]["lost_fraction"][cause] for n in names]
        right.bar(names, values, bottom=bottom, label=CAUSE_LABELS[cause])
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    right.set_ylabel("wall time lost (%)")
    right.set_title("lost time by cause")
    right.legend(fontsize=8)
    fig.suptitle(report["mix"]["title"], fontsize=10)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
