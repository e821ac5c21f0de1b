"""NVSwitch SXids: a fatal one takes the node's NVLink fabric down; a non-fatal one is recorded.

=================================================  ===========================================================
``sxid`` event                                     actions
=================================================  ===========================================================
fatal (``data.extra.fatal`` true, as the parser    checkpoint_restart of the node's jobs excluding the node,
reads "Fatal error" in the message; or severity    then drain_node: the switch (and every GPU behind it) needs
critical when the parser did not say)              a node reboot / Fabric Manager restart before new work
non-fatal                                          nothing (recorded; counted by nothing)
=================================================  ===========================================================

Storm summaries and follow-ons are part of their first line's incident.
"""

from __future__ import annotations

from ftd.plugin import ActionRequest, ClusterView, Event, Kind, hookimpl
from ftd.plugin.helpers import already_judged, drain, restart_jobs


def is_fatal(event: Event) -> bool:
    extra = event.data.get("extra")
    fatal = extra.get("fatal") if isinstance(extra, dict) else None
    if isinstance(fatal, bool):
        return fatal
    return event.severity == "critical"


#: The only kinds this rule decides on (the coordinator skips it for the others).
EVENT_KINDS = frozenset({Kind.SXID})


@hookimpl
def ftd_evaluate(event: Event, view: ClusterView) -> list[ActionRequest] | None:
    if event.kind != Kind.SXID or already_judged(event) or not is_fatal(event):
        return None
    code = event.data.get("code")
    extra = event.data.get("extra")
    link = extra.get("link") if isinstance(extra, dict) else None
    where = f" link {link}" if link is not None else ""
    reason = f"fatal sxid {code} on nvswitch {event.data.get('pci') or '?'}{where}: reboot the node"
    params = {"code": code, "pci": event.data.get("pci"), "sxid": True}
    jobs = view.jobs_on_node(event.node)
    return [*restart_jobs(jobs, event, reason, exclude=True, params=params), drain(event, reason, params)]
