"""``ftd actions list|show|approve|reject``: follow and decide ftd's actions from the command line.

What (all through the coordinator's HTTP API, found as :mod:`ftd.commands.api_client` says:
``--url``, ``--config``, ``$FTD_CONFIG`` or ``/etc/ftd/coordinator.toml``, never a guessed port):

- ``list [--state S,...] [--target NAME] [--limit N] [--json]``: the newest actions (``/v1/actions``)
  with id, kind, target, phase, state, ranks acked / expected, deadline (when a running action
  counts as stuck, from ``/v1/summary``) and why it failed, was suppressed, escalated or only
  logged (:mod:`ftd.commands.action_view`);
- ``show ID [--json]``: one action (``/v1/actions/ID``): its request, the ledger's record of it
  (created, each phase done, last update and state), its detail, and the steps of the plan it
  belongs to (``/v1/plans/PLAN``: every action one event's rules asked for, in order, with states);
- ``approve ID [--by NAME]`` / ``reject ID [--reason TEXT] [--by NAME]``: decide an action held
  for approval (``POST /v1/actions/ID/approve|reject``) with the API token (``--token-file``, else
  the config's ``coordinator.api.token_file``), then print its new state. ``--by`` defaults to the
  login name running the command: the API token is one shared secret and names no user, so who
  decided is what the caller says (recorded, and shown in ``show``'s history).

Exit 0; 1 when the API cannot be reached or refuses (the message names the URL and the API's
reason, e.g. an action that already succeeded); 2 when nothing says which coordinator, or
``--state`` names a state no action has (the message lists them).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.parse
from typing import Any

from ftd.commands import action_view as view
from ftd.commands.api_client import ApiFailure, ApiTarget, add_target_options, resolve

#: Every state an action can be in (:class:`ftd.plugin.actions.ActionState`), for ``--state``.
STATES = (
    "pending",
    "running",
    "awaiting_approval",
    "succeeded",
    "escalated",
    "failed",
    "suppressed",
    "dry_run",
    "logged",
)


def default_by() -> str:
    """Who decides, when ``--by`` does not say: the user behind ``sudo`` (the token file is root's:
    the documented way is ``sudo ftd actions approve``), else the login name running the command
    (the API token is one shared secret: it names no user), else ``operator``."""
    import getpass
    import os

    behind_sudo = os.environ.get("SUDO_USER", "")
    if behind_sudo and behind_sudo != "root":
        return behind_sudo
    try:
        return getpass.getuser() or "operator"
    except (OSError, KeyError):  # no login name and no passwd entry (a container's odd uid)
        return "operator"


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "actions",
        help="follow, approve and reject ftd's actions (phase, acks, deadline, why)",
        description="Follow and decide ftd's actions through the coordinator's API.",
    )
    verbs = parser.add_subparsers(dest="actions_verb", metavar="VERB", required=True)
    listing = verbs.add_parser("list", help="the newest actions: phase, state, acks, deadline, why")
    add_target_options(listing)
    listing.add_argument("--state", help="only these states, comma-separated (e.g. running,failed)")
    listing.add_argument("--target", help="only actions on this node or job")
    listing.add_argument("--limit", type=int, default=50, help="newest N read from the ledger (default 50)")
    listing.add_argument("--json", action="store_true", help="print the actions as JSON")
    listing.set_defaults(handler=run_list)
    show = verbs.add_parser("show", help="one action: request, ledger history, detail, plan steps")
    add_target_options(show)
    show.add_argument("id", help="action id")
    show.add_argument("--json", action="store_true", help="print {action, plan} as JSON")
    show.set_defaults(handler=run_show)
    for verb in ("approve", "reject"):
        p = verbs.add_parser(verb, help=f"{verb} an action awaiting approval (needs the API token)")
        add_target_options(p, token=True)
        p.add_argument("id", help="action id")
        p.add_argument("--by", default=None, help="who decides (recorded; default: your login name)")
        if verb == "reject":
            p.add_argument("--reason", default="no reason given", help="why (recorded)")
        p.set_defaults(handler=run_decide, verb=verb)


def _quote(action_id: str) -> str:
    return urllib.parse.quote(action_id, safe="")


def _deadlines(api: ApiTarget) -> dict[str, float]:
    """``/v1/summary``'s deadlines; empty from a coordinator without that endpoint."""
    try:
        summary = api.get("/v1/summary")
    except ApiFailure:
        return {}
    deadlines = summary.get("deadlines") if isinstance(summary, dict) else None
    return deadlines if isinstance(deadlines, dict) else {}


def _jobs(api: ApiTarget) -> dict[str, dict[str, Any]]:
    return {str(j["id"]): j for j in api.get("/v1/jobs")}


def rows(
    actions: list[dict[str, Any]], jobs: dict[str, dict[str, Any]], deadlines: dict[str, float]
) -> list[list[str]]:
    return [
        [
            a["id"],
            a["kind"],
            a["target"],
            view.phase(a),
            view.state_text(a),
            view.acks(a, jobs),
            view.deadline(a, deadlines),
            view.why(a) or "-",
        ]
        for a in actions
    ]


HEADERS = ["id", "kind", "target", "phase", "state", "acks", "deadline", "why"]


def run_list(args: argparse.Namespace) -> int:
    from ftd.commands.status import table

    api = resolve(args, "actions list")
    if isinstance(api, int):
        return api
    limit = max(1, min(int(args.limit), 1000))
    states = {s.strip() for s in (args.state or "").split(",") if s.strip()}
    unknown = sorted(states - set(STATES))
    if unknown:
        print(
            f"ftd actions list: unknown state(s) {', '.join(unknown)}; the states are {', '.join(STATES)}",
            file=sys.stderr,
        )
        return 2
    try:
        actions = api.get(f"/v1/actions?limit={limit}")
        actions = [
            a
            for a in actions
            if (not states or a["state"] in states) and (not args.target or a["target"] == args.target)
        ]
        jobs, deadlines = _jobs(api), _deadlines(api)
    except ApiFailure as exc:
        print(f"ftd actions list: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(actions, sort_keys=True))
        return 0
    print(f"ACTIONS ({len(actions)} of the newest {limit}) from {api.url}")
    print(table(HEADERS, rows(actions, jobs, deadlines)))
    return 0


def _when(ts: Any) -> str:
    if not isinstance(ts, int | float) or not ts:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def history(action: dict[str, Any]) -> list[str]:
    """What the ledger's record says happened, in order (it keeps the latest state, the phases done
    and the two times)."""
    detail = action.get("detail") or {}
    lines = [
        f"{_when(action.get('created'))}  requested by {action.get('rule') or '-'}: {action.get('reason')}"
    ]
    if detail.get("approved_by"):  # held for approval, then approved (an older ledger has no time)
        lines.append(f"{_when(detail.get('approved_at')):19}  approved by {detail['approved_by']}")
    if detail.get("rejected_by"):
        lines.append(f"{_when(detail.get('rejected_at')):19}  rejected by {detail['rejected_by']}")
    for done in detail.get("phases_done") or []:
        lines.append(f"{'':19}  phase {done} done")
    if action.get("state") == "running" and detail.get("phase"):
        lines.append(f"{'':19}  phase {detail['phase']} under way")
    resumed = view.resumed_from(action)
    if resumed:
        lines.append(f"{'':19}  resumes from {resumed}")
    last = f"{_when(action.get('updated'))}  {view.state_text(action)}"
    reason = view.why(action)
    lines.append(last + (f": {reason}" if reason else ""))
    return lines


def render_show(action: dict[str, Any], plan: dict[str, Any] | None) -> str:
    from ftd.commands.status import table

    out = [
        f"action {action['id']}: {action['kind']} {action['target']}  state {view.state_text(action)}",
        f"  rule {action.get('rule') or '-'}  event {action.get('event_id') or '-'}"
        f"  phase {view.phase(action)}",
        f"  params {json.dumps(action.get('params') or {}, sort_keys=True)}",
        "",
        "HISTORY (the ledger's record)",
        *("  " + line for line in history(action)),
        "",
        *(
            ["VERDICT", *("  " + line for line in verdict), ""]
            if (verdict := view.verdict_lines(action))
            else []
        ),
        "DETAIL",
        *(
            "  " + line
            for line in json.dumps(action.get("detail") or {}, indent=2, sort_keys=True).splitlines()
        ),
    ]
    if plan is not None:
        steps = [
            [
                s["action"] + ("  <- this" if s["action"] == action["id"] else ""),
                s["kind"],
                s["target"],
                str(s["state"]),
            ]
            for s in plan.get("steps") or []
        ]
        out += ["", f"PLAN {plan['id']} ({plan.get('state')}, event {plan.get('event_id') or '-'})"]
        out += ["  " + line for line in table(["step", "kind", "target", "state"], steps).splitlines()]
    return "\n".join(out)


def run_show(args: argparse.Namespace) -> int:
    api = resolve(args, "actions show")
    if isinstance(api, int):
        return api
    try:
        action = api.get(f"/v1/actions/{_quote(args.id)}")
        plan_id = (action.get("detail") or {}).get("plan")
    except ApiFailure as exc:
        print(f"ftd actions show: {exc}", file=sys.stderr)
        return 1
    plan = None
    if plan_id:
        try:
            plan = api.get(f"/v1/plans/{_quote(str(plan_id))}")
        except ApiFailure as exc:  # an older coordinator has no /v1/plans: the action alone
            print(f"ftd actions show: plan {plan_id}: {exc}", file=sys.stderr)
    if args.json:
        print(json.dumps({"action": action, "plan": plan}, sort_keys=True))
    else:
        print(render_show(action, plan))
    return 0


def run_decide(args: argparse.Namespace) -> int:
    verb = args.verb
    api = resolve(args, f"actions {verb}")
    if isinstance(api, int):
        return api
    body: dict[str, Any] = {"by": args.by or default_by()}
    if verb == "reject":
        body["reason"] = args.reason
    try:
        action = api.post(f"/v1/actions/{_quote(args.id)}/{verb}", body)
    except ApiFailure as exc:
        print(f"ftd actions {verb}: {exc}", file=sys.stderr)
        return 1
    done = {"approve": "approved", "reject": "rejected"}[verb]
    print(f"{done} {action['id']}: {action['kind']} {action['target']} is now {view.state_text(action)}")
    return 0
