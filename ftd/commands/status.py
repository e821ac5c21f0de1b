"""``ftd status [--url URL | --config PATH] [--json]``: the cluster as the coordinator sees it.

What: reads the coordinator's HTTP API (``/healthz``, ``/v1/nodes``, ``/v1/jobs``, ``/v1/actions``,
``/v1/ha``), prints who leads (active/standby: the leader, its lease epoch and the lease's age) and
three tables: nodes (online/offline, drained by ftd and why, jobs), jobs (nodes, ranks,
last step) and recent actions. ``--json`` prints one JSON object ``{"health", "nodes", "jobs",
"actions", "ha"}`` instead. The URL is ``--url``, else ``http://{coordinator.api.host}:{port}`` from
``--config``, else ``http://127.0.0.1:8787``. Exit 0; 1 if the API cannot be reached or answers an
error (the message says which URL and why).

Why stdlib ``urllib``: the command must work from any login node with only the base install.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8787"


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "status",
        help="show nodes, jobs and recent actions",
        description="Show the cluster as the coordinator sees it.",
    )
    parser.add_argument(
        "--url", help=f"coordinator API base URL (default: from --config, else {DEFAULT_URL})"
    )
    parser.add_argument("--config", metavar="PATH", help="TOML config to take coordinator.api.host/port from")
    parser.add_argument(
        "--actions", type=int, default=10, metavar="N", help="recent actions to show (default 10)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.add_argument("--timeout", type=float, default=5.0, help="HTTP timeout in seconds (default 5)")
    parser.set_defaults(handler=run)


def base_url(args: argparse.Namespace) -> str:
    if args.url:
        return str(args.url).rstrip("/")
    if args.config:
        from ftd.config import load_config

        api = load_config(args.config).coordinator.api
        host = "127.0.0.1" if api.host in ("0.0.0.0", "::") else api.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{api.port}"
    return DEFAULT_URL


def fetch(url: str, timeout: float) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.load(response)


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


def render(data: dict[str, Any], url: str) -> str:
    health, nodes, jobs, actions = data["health"], data["nodes"], data["jobs"], data["actions"]
    online = sum(1 for n in nodes if n["online"])
    drained = sum(1 for n in nodes if n["drained"])
    out = [
        f"coordinator {url}  version {health.get('version', '?')}  "
        f"bus {'connected' if health.get('bus_connected') else 'DISCONNECTED'}",
        _ha_line(data.get("ha")),
        "",
        f"NODES ({len(nodes)}: {online} online, {drained} drained by ftd)",
        table(
            ["node", "state", "drained", "reason", "jobs", "conditions"],
            [
                [
                    n["name"],
                    "online" if n["online"] else "offline",
                    "yes" if n["drained"] else "no",
                    n["drain_reason"] or "-",
                    ",".join(n["jobs"]) or "-",
                    "; ".join(n.get("conditions") or []) or "-",  # what `ftd health` reports there
                ]
                for n in nodes
            ],
        ),
        "",
        f"JOBS ({len(jobs)})",
        table(
            ["job", "nodes", "ranks", "last step", "client", "user"],
            [
                [
                    j["id"],
                    ",".join(j["nodes"]) or "-",
                    str(len(j["ranks"])),
                    "-" if j["last_step"] is None else str(j["last_step"]),
                    _client(j),
                    _user(j),
                ]
                for j in jobs
            ],
        ),
        "",
        f"RECENT ACTIONS ({len(actions)})",
        table(
            ["when", "id", "kind", "target", "state", "rule", "reason"],
            [
                [
                    _when(a["created"]),
                    a["id"],
                    a["kind"],
                    a["target"],
                    _action_state(a),
                    a["rule"] or "-",
                    a["reason"],
                ]
                for a in actions
            ],
        ),
    ]
    return "\n".join(out)


def _action_state(action: dict[str, Any]) -> str:
    """The action's state, with what a running one is waiting for (a restart following its job)."""
    waiting = (action.get("detail") or {}).get("waiting")
    if action["state"] == "running" and isinstance(waiting, str) and waiting:
        return f"running: {waiting}"
    return str(action["state"])


def _ha(url: str, timeout: float) -> Any:
    """``/v1/ha`` (who leads, the lease epoch and age); None from a coordinator without it (404)."""
    try:
        return fetch(f"{url}/v1/ha", timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def _ha_line(ha: dict[str, Any] | None) -> str:
    if ha is None or ha.get("role") == "single":
        return "single coordinator (sqlite ledger)"
    age = ha.get("lease_age_s")
    renewed = "?" if age is None else f"{age:.1f} s ago"
    return (
        f"leader {ha.get('leader') or 'NONE'}  epoch {ha.get('leader_epoch')}  lease renewed {renewed}  "
        f"this coordinator: {ha.get('identity')} ({ha.get('role')})"
    )


def run(args: argparse.Namespace) -> int:
    from ftd.config import ConfigError

    try:
        url = base_url(args)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    limit = max(1, min(int(args.actions), 1000))
    try:
        data = {
            "health": fetch(f"{url}/healthz", args.timeout),
            "nodes": fetch(f"{url}/v1/nodes", args.timeout),
            "jobs": fetch(f"{url}/v1/jobs", args.timeout),
            "actions": fetch(f"{url}/v1/actions?limit={limit}", args.timeout),
            "ha": _ha(url, args.timeout),
        }
    except urllib.error.HTTPError as exc:
        print(f"ftd status: {exc.url}: HTTP {exc.code} {exc.reason}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        print(f"ftd status: cannot reach the coordinator API at {url}: {reason}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(data, sort_keys=True))
    else:
        print(render(data, url))
    return 0
