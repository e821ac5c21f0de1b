"""``ftd status [--url URL | --config PATH] [--problems] [--node NAME] [--json]``: the cluster as the
coordinator sees it.

What: reads the coordinator's HTTP API (``/healthz``, ``/v1/nodes``, ``/v1/jobs``, ``/v1/actions``,
``/v1/ha``, ``/v1/summary`` for the actions' deadlines), prints who leads (active/standby: the
leader, its lease epoch and the lease's age) and three tables: nodes (online/offline, drained by ftd
and why, jobs, conditions), jobs (nodes, ranks, last step; for a job run by ``ftd run`` its
generation and hot spares) and recent actions (a running one with its phase, the ranks' acks and its
deadline: :mod:`ftd.commands.action_view`). A node's state is the coordinator's (offline, drained by
ftd, unavailable: drained or down by someone else, with the scheduler's reason, condition, or
online), and the header counts online, offline, drained and unavailable nodes. A job ftd requeued
and that does not train again yet stays in the jobs table as "pending after requeue, excluding
NODES", with a line saying since when and which action moved it (issue #32). ``--problems`` shows only
nodes offline, drained (by ftd or the scheduler) or with an active condition (the API's
``/v1/nodes?problems=true``, filtered again here for an older coordinator), the jobs on them and
the jobs ftd moved, and the actions in flight, failed or escalated (a failed or escalated one that a
later action of the same kind on the same target did is left out). ``--node NAME`` shows that node,
its jobs (and those ftd moved off it), the actions on it or its jobs and its latest events.
``--json`` prints one JSON object ``{"health", "nodes", "jobs", "actions", "ha"}`` (plus
``"events"`` with ``--node``) instead.

Which coordinator: ``--url``, else ``coordinator.api`` from ``--config``, ``$FTD_CONFIG`` or
``/etc/ftd/coordinator.toml`` (:mod:`ftd.commands.api_client`); with none of them the command says
what to pass instead of reading whatever listens on a local port. Exit 0; 1 if the API cannot be
reached or answers an error (the message says which URL and why); 2 if nothing names a coordinator
or ``--node`` names a node it does not know.

Why stdlib ``urllib``: the command must work from any login node with only the base install.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from ftd.commands import action_view as view
from ftd.commands.api_client import ApiFailure, ApiTarget, add_target_options, resolve

PROBLEM_ACTION_STATES = (*view.IN_FLIGHT, *view.TROUBLE)


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "status",
        help="show nodes, jobs and recent actions",
        description="Show the cluster as the coordinator sees it.",
    )
    add_target_options(parser)
    parser.add_argument(
        "--actions", type=int, default=10, metavar="N", help="recent actions to show (default 10)"
    )
    parser.add_argument(
        "--problems",
        action="store_true",
        help="only nodes offline, drained or with an active condition, and actions in flight or failed",
    )
    parser.add_argument("--node", metavar="NAME", help="only this node, its jobs, actions and latest events")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.set_defaults(handler=run)


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def _client(job: dict[str, Any]) -> str:
    """``yes`` when ranks registered through ftd.client; ``no (prolog)`` for a job only the Slurm
    Prolog reported (ftd moves it with Slurm's signal convention)."""
    if job["ranks"]:
        return "yes"
    return "no (prolog)" if job.get("allocations") else "-"


def _user(job: dict[str, Any]) -> str:
    users = sorted({a.get("user") or "" for a in (job.get("allocations") or {}).values()} - {""})
    return ",".join(users) or "-"


def _spares(job: dict[str, Any]) -> str:
    """A job run by ``ftd run``: its hot spares, each with its preflight when not passed
    (``node2(failed)``, ``node3(unchecked)``); ``none`` when it has used them all; ``-`` for a job
    without supervisors (an older coordinator sends no ``supervisors``)."""
    supervisors = job.get("supervisors") or {}
    if not supervisors:
        return "-"
    names = []
    for node in job.get("spares") or []:
        preflight = (supervisors.get(node) or {}).get("preflight")
        names.append(node if preflight == "ok" else f"{node}({preflight or 'unchecked'})")
    return ",".join(names) or "none"


def _checkpoint(job: dict[str, Any]) -> str:
    """The job's newest checkpoint verified on every rank, as ``STEP/LEVEL`` (the fastest level holding
    that step; ``/v1/jobs``' ``checkpoints``, issue #34), or ``-`` for a job that reports none."""
    levels = [(lv, c["step"]) for lv, c in (job.get("checkpoints") or {}).items() if isinstance(c, dict)]
    if not levels:
        return "-"
    level, step = max(levels, key=lambda item: item[1])  # the first (fastest) level on a tie
    return f"{int(step)}/{level}"


def node_state(node: dict[str, Any]) -> str:
    """The node's one state as the coordinator judges it (offline, drained by ftd, unavailable:
    drained or down by someone else, an active condition), ``online`` otherwise; an older
    coordinator that sends no state: online or offline."""
    state = node.get("state")
    if isinstance(state, str) and state and state not in ("healthy", "acting"):
        return state
    return "online" if node["online"] else "offline"


def _conditions(node: dict[str, Any]) -> str:
    """What ``ftd health`` reports there, and the node's version drift (its fields, issue #36)."""
    drift = node.get("drift") or []
    fields = [str(reason).partition(":")[0] for reason in drift]
    texts = [*(node.get("conditions") or []), *([f"version drift: {', '.join(fields)}"] if fields else [])]
    return "; ".join(texts) or "-"


def _drained(node: dict[str, Any]) -> str:
    """Who took the node out of service: ``ftd``, ``other`` (an operator, the scheduler), ``no``."""
    if node["drained"]:
        return "ftd"
    return "other" if node.get("unavailable") else "no"


def job_state(job: dict[str, Any]) -> str:
    """What the job is doing (``/v1/jobs``' state); a job ftd moved says which nodes it excludes."""
    state = str(job.get("state") or "-")
    moved = job.get("moved")
    if isinstance(moved, dict) and state == "pending after requeue":
        excluding = _excluding(job)
        state += f", excluding {','.join(excluding)}" if excluding else " in place"
    return state


def _excluding(job: dict[str, Any]) -> list[str]:
    """The nodes a job ftd moved was requeued without ([] for any other job)."""
    moved = job.get("moved")
    excluding = moved.get("excluding") if isinstance(moved, dict) else None
    return [str(n) for n in excluding] if isinstance(excluding, list) else []


def _moved_lines(jobs: list[dict[str, Any]]) -> list[str]:
    """One line per job ftd requeued and that does not train again yet: since when, which action."""
    return [f"job {j['id']}: {j['moved']['why']}" for j in jobs if isinstance(j.get("moved"), dict)]


def render(data: dict[str, Any], url: str, title: str = "") -> str:
    health, nodes, jobs, actions = data["health"], data["nodes"], data["jobs"], data["actions"]
    online = sum(1 for n in nodes if n["online"])
    drained = sum(1 for n in nodes if n["drained"])
    unavailable = sum(1 for n in nodes if n.get("unavailable") and not n["drained"])
    by_id = data.get("every_job") or {str(j["id"]): j for j in jobs}  # the ranks a save expects
    deadlines = data.get("deadlines") or {}
    out = [
        f"coordinator {url}  version {health.get('version', '?')}  "
        f"bus {'connected' if health.get('bus_connected') else 'DISCONNECTED'}",
        _ha_line(data.get("ha")),
        "",
        f"NODES{title} ({len(nodes)}: {online} online, {len(nodes) - online} offline, "
        f"{drained} drained by ftd, {unavailable} unavailable)",
        table(
            ["node", "state", "drained", "reason", "jobs", "conditions"],
            [
                [
                    n["name"],
                    node_state(n),
                    _drained(n),
                    n["drain_reason"] or n.get("unavailable") or "-",
                    ",".join(n["jobs"]) or "-",
                    _conditions(n),
                ]
                for n in nodes
            ],
        ),
        "",
        f"JOBS ({len(jobs)})",
        table(
            ["job", "state", "nodes", "ranks", "last step", "checkpoint", "client", "user", "gen", "spares"],
            [
                [
                    j["id"],
                    job_state(j),
                    ",".join(j["nodes"]) or "-",
                    str(len(j["ranks"])),
                    "-" if j["last_step"] is None else str(j["last_step"]),
                    _checkpoint(j),
                    _client(j),
                    _user(j),
                    "-" if j.get("generation") is None else str(j["generation"]),
                    _spares(j),
                ]
                for j in jobs
            ],
        ),
        *_moved_lines(jobs),
        "",
        f"{'ACTIONS IN FLIGHT OR FAILED' if title else 'RECENT ACTIONS'} ({len(actions)})",
        table(
            ["when", "id", "kind", "target", "state", "rule", "reason"],
            [
                [
                    _when(a["created"]),
                    a["id"],
                    a["kind"],
                    a["target"],
                    view.running_text(a, by_id, deadlines),
                    a["rule"] or "-",
                    a["reason"],
                ]
                for a in actions
            ],
        ),
    ]
    return "\n".join(out)


def _optional(api: ApiTarget, path: str) -> Any:
    """``path``'s answer, or None from a coordinator that does not serve it (older, or a standby)."""
    try:
        return api.get(path)
    except ApiFailure:
        return None


def is_problem(node: dict[str, Any]) -> bool:
    """Offline, drained (by ftd or the scheduler) or with an active condition."""
    return (
        not node["online"] or node["drained"] or bool(node.get("unavailable")) or bool(node.get("conditions"))
    )


def superseded(action: dict[str, Any], recent: list[dict[str, Any]]) -> bool:
    """A failed or escalated action that a later one of the same kind on the same target did
    (a drain retried by the unacted-condition retry, a restart asked again): no longer a problem."""
    if action["state"] not in view.TROUBLE:
        return False
    return any(
        other["kind"] == action["kind"]
        and other["target"] == action["target"]
        and other["state"] == "succeeded"
        and (other.get("created") or 0) > (action.get("created") or 0)
        for other in recent
    )


def _ha_line(ha: dict[str, Any] | None) -> str:
    if ha is None or ha.get("role") == "single":
        return "single coordinator (sqlite ledger)"
    age = ha.get("lease_age_s")
    renewed = "?" if age is None else f"{age:.1f} s ago"
    return (
        f"leader {ha.get('leader') or 'NONE'}  epoch {ha.get('leader_epoch')}  lease renewed {renewed}  "
        f"this coordinator: {ha.get('identity')} ({ha.get('role')})"
    )


def collect(api: ApiTarget, args: argparse.Namespace) -> dict[str, Any]:
    """What the tables show, filtered as ``--problems`` / ``--node`` ask (ApiFailure on errors)."""
    limit = max(1, min(int(args.actions), 1000))
    nodes = api.get("/v1/nodes?problems=true" if args.problems else "/v1/nodes")
    jobs = api.get("/v1/jobs")
    data: dict[str, Any] = {"health": api.get("/healthz"), "ha": _optional(api, "/v1/ha")}
    data["every_job"] = {str(j["id"]): j for j in jobs}
    summary = _optional(api, "/v1/summary")
    deadlines = summary.get("deadlines") if isinstance(summary, dict) else None
    data["deadlines"] = deadlines if isinstance(deadlines, dict) else {}
    if args.problems:
        nodes = [n for n in nodes if is_problem(n)]
        names = {n["name"] for n in nodes}
        jobs = [j for j in jobs if names & set(j["nodes"]) or j.get("moved")]
        recent = api.get(f"/v1/actions?limit={max(limit, 200)}")
        actions = [a for a in recent if a["state"] in PROBLEM_ACTION_STATES and not superseded(a, recent)]
        actions = actions[:limit]
    elif args.node:
        nodes = [n for n in nodes if n["name"] == args.node]
        if not nodes:
            raise LookupError(f"node {args.node!r} is not known to the coordinator at {api.url}")
        jobs = [j for j in jobs if args.node in j["nodes"] or args.node in _excluding(j)]
        targets = {args.node} | {str(j["id"]) for j in jobs}
        recent = api.get(f"/v1/actions?limit={max(limit, 200)}")
        actions = [
            a for a in recent if a["target"] in targets or (a.get("params") or {}).get("node") == args.node
        ]
        actions = actions[:limit]
        data["events"] = api.get(f"/v1/events?node={args.node}&limit={limit}")
        data["inventory"] = _optional(api, f"/v1/nodes/{args.node}/inventory")  # None: none reported
    else:
        actions = api.get(f"/v1/actions?limit={limit}")
    data.update(nodes=nodes, jobs=jobs, actions=actions)
    return data


def run(args: argparse.Namespace) -> int:
    api = resolve(args, "status")
    if isinstance(api, int):
        return api
    try:
        data = collect(api, args)
    except ApiFailure as exc:
        print(f"ftd status: {exc}", file=sys.stderr)
        return 1
    except LookupError as exc:
        print(f"ftd status: {exc.args[0]}", file=sys.stderr)
        return 2
    if args.json:
        data.pop("deadlines", None)
        data.pop("every_job", None)
        print(json.dumps(data, sort_keys=True))
        return 0
    title = " WITH PROBLEMS" if args.problems else (f" {args.node}" if args.node else "")
    print(render(data, api.url, title))
    if args.node:
        print(f"\nLATEST EVENTS ON {args.node} ({len(data['events'])})")
        print(
            table(
                ["when", "id", "kind", "severity", "source"],
                [[_when(e["ts"]), e["id"], e["kind"], e["severity"], e["source"]] for e in data["events"]],
            )
        )
        print("\n" + render_inventory(args.node, data.get("inventory")))
    return 0


def render_inventory(node: str, inventory: dict[str, Any] | None) -> str:
    """``--node``'s INVENTORY section: each fact (or ``unknown (why)``), each GPU and NIC, its drift."""
    if not isinstance(inventory, dict):
        return f"INVENTORY OF {node}: none reported (an agent without issue #36, or inventory disabled)"
    facts = inventory.get("facts") or {}
    drift = inventory.get("drift") or {}
    when = inventory.get("reported_at")
    out = [
        f"INVENTORY OF {node} (reported {_when(when) if isinstance(when, int | float) else '?'})",
        table(["fact", "value"], [[str(k), str(v)] for k, v in facts.items()]),
    ]
    gpus = inventory.get("gpus") or []
    if gpus:
        keys = ("index", "name", "serial", "vbios")
        out.append(table(["gpu", "name", "serial", "vbios"], [[str(g.get(k)) for k in keys] for g in gpus]))
    nics = inventory.get("nics") or []
    if nics:
        nic_keys = ("device", "fw_ver", "board_id")
        out.append(table(["nic", "firmware", "board"], [[str(n.get(k)) for k in nic_keys] for n in nics]))
    reasons = drift.get("reasons") or []
    if reasons:
        out.append(f"DRIFT (action {drift.get('action')}): " + "; ".join(str(r) for r in reasons))
    elif drift.get("unchecked"):
        out.append(f"DRIFT: not checked: {drift['unchecked']}")
    else:
        out.append("DRIFT: none")
    return "\n".join(out)
