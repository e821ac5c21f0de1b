"""``ftd xid explain CODE [--json]``: what an Xid means and what ftd (and NVIDIA) say to do about it.

What: prints the catalog entry for CODE: mnemonic, description, NVIDIA's immediate-action bucket and
what that bucket asks of an operator, what ftd does about it (the plan of :mod:`ftd.catalog.remedy`,
the very table the ``xid_catalog`` rule decides by) and whether it counts as a hardware fault for
the repeat-offender rule, whether the GPU is unusable until then (fatal), the codes it is
typically a follow-on of, notes, and the catalog version and source it came from. ``--json`` prints
the entry as one JSON object instead. An unknown CODE exits 2 with a message.

Why: on-call engineers meet an Xid in a drain reason or a dmesg dump and need the meaning and the
next step without leaving the terminal; the same data drives the agent and the rules.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "xid", help="explain NVIDIA Xid codes", description="Look up NVIDIA Xid codes in ftd's catalog."
    )
    sub = parser.add_subparsers(dest="xid_what", metavar="ACTION")
    explain = sub.add_parser("explain", help="explain one Xid code", description="Explain one Xid code.")
    explain.add_argument("code", metavar="CODE", help="the Xid number, e.g. 79")
    explain.add_argument("--json", action="store_true", help="print one JSON object")
    explain.set_defaults(handler=run_explain)
    parser.set_defaults(handler=lambda _args: _usage(parser))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_usage(sys.stderr)
    print("ftd xid: try `ftd xid explain 79`", file=sys.stderr)
    return 2


def run_explain(args: argparse.Namespace) -> int:
    import msgspec

    from ftd.catalog import load_xid_catalog
    from ftd.catalog.remedy import bucket_plan, resolve_xid

    catalog = load_xid_catalog()
    text = str(args.code).strip()
    info = catalog.lookup(int(text)) if text.isdecimal() else None
    if info is None:
        print(
            f"ftd xid explain: Xid {text!r} is not in the catalog (version {catalog.version}); "
            f"ftd treats unknown codes as {catalog.unknown_action}",
            file=sys.stderr,
        )
        return 2
    meaning = catalog.action_meaning(info.action)
    remedy = resolve_xid(info.code, {}, catalog)
    plan = bucket_plan(info.action)
    if args.json:
        doc = msgspec.to_builtins(info)
        doc.update(
            action_meaning=meaning,
            catalog_version=catalog.version,
            catalog_source=catalog.source,
            ftd_plan=remedy.plan,
            ftd_does=plan.does,
            implicates_hardware=plan.implicates_hardware,
        )
        print(msgspec.json.encode(doc).decode())
        return 0
    rows = [
        ("Xid", f"{info.code}  {info.name}"),
        ("Meaning", info.description),
        (
            "Action",
            f"{info.action}{'  (chosen by ftd: NVIDIA publishes no bucket)' if info.inferred else ''}",
        ),
        ("What to do", meaning),
        ("ftd does", plan.does),
        (
            "Repeats",
            "count towards draining a repeat offender (hardware)"
            if plan.implicates_hardware
            else "never make the node a repeat offender (not hardware)",
        ),
        ("Fatal", "yes: the GPU takes no new work until the action is done" if info.fatal else "no"),
        ("Severity", info.severity),
    ]
    if info.investigate:
        rows.append(("Investigate", info.investigate))
    if info.follows:
        rows.append(("Follows", ", ".join(f"Xid {code}" for code in info.follows)))
    if info.applies_to:
        rows.append(("Applies to", ", ".join(info.applies_to)))
    if info.unused:
        rows.append(("Note", "unused on current data-centre GPUs"))
    if info.notes:
        rows.append(("Notes", info.notes))
    if plan.plan == "nvlink5":
        rows.append(("Decoded", "per message: fatal -> reset after the save; non-fatal -> notify"))
    rows.append(("Catalog", f"version {catalog.version}; {catalog.source}"))
    for label, value in rows:
        print(f"{label + ':':<13}{value}")
    return 0
