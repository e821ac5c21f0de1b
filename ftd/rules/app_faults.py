"""Application faults in the training logs: restart the job in place, with crash-loop backoff.

==============================================  ===========================================================
``log_pattern`` event                           actions
==============================================  ===========================================================
``data.pattern`` an application error:          checkpoint_restart of the job (``data.job``, else the jobs
cuda_oom, cuda_error,                           on the node) in place, ``params.delay_s`` the crash-loop
cuda_illegal_memory_access,                     backoff (0 s, then ``policy.app_fault_backoff_s`` doubling
cuda_launch_failure, segfault, bus_error,       up to ``app_fault_backoff_max_s``); one incident (the same
host_oom, torch_elastic_failure                 pattern on several ranks / nodes of the job within 60 s)
                                                asks once
the same, after                                 notify "crash loop", no restart
``policy.app_fault_restart_limit`` (default 3)
restarts of that pattern within
``app_fault_window_s`` (default 3600 s)
a pattern whose ``disposition`` is ``stop``      checkpoint_restart of the job with ``params.save`` and
(the catalog's: config_error, argument_error,   ``params.requeue`` false: the job is stopped, neither saved
import_error, path_not_found,                   nor requeued, + notify with the signature and the line;
checkpoint_mismatch, shape_mismatch,            once per incident (the same line on every rank asks once)
nan_or_inf, time_limit; or the event's own
``data.disposition``)
any other pattern (nccl_*: rule ``nccl_ib``;    nothing here
python_traceback, nccl_warn: context only)
==============================================  ===========================================================

A failure that would fail again is never restarted: a configuration error restarted three times is
three allocations spent before anyone hears. The stop carries its evidence (``params.signature``,
``params.line``, ``params.file``) into the ledger and ``ftd rules test``.

Never a drain: a program's own error says nothing about the node (repeat_offender does not count
these either). Storm summaries (``repeat_of``) are part of their first line's incident.
"""

from __future__ import annotations

from ftd.catalog.log_patterns import dispositions
from ftd.plugin import ActionRequest, ClusterView, Event, Kind, hookimpl
from ftd.plugin.helpers import already_judged, jobs_of
from ftd.plugin.settings import RuleSettings
from ftd.rules._incidents import APP_PATTERNS, app_fault_actions, stop_job_actions

#: The only kinds this rule decides on (the coordinator skips it for the others).
EVENT_KINDS = frozenset({Kind.LOG_PATTERN})


@hookimpl
def ftd_evaluate(event: Event, view: ClusterView, settings: RuleSettings) -> list[ActionRequest] | None:
    if event.kind != Kind.LOG_PATTERN or already_judged(event):
        return None
    pattern = event.data.get("pattern")
    if not isinstance(pattern, str):
        return None
    where = event.data.get("file")
    what = f"{pattern} in {where}" if isinstance(where, str) and where else str(pattern)
    if disposition_of(event, pattern) == "stop":
        return stop_job_actions(event, view, jobs_of(event, view), what) or None
    if pattern not in APP_PATTERNS:
        return None
    return app_fault_actions(event, view, jobs_of(event, view), what, settings.app_faults) or None


def disposition_of(event: Event, pattern: str) -> str | None:
    """``restart``, ``stop`` or None: the event's own ``data.disposition`` (an operator's table),
    else the built-in catalog's for the pattern's name."""
    own = event.data.get("disposition")
    if own in ("restart", "stop"):
        return str(own)
    return dispositions().get(pattern)
