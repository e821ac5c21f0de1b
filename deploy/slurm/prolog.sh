#!/bin/sh
# Slurm Prolog (slurm.conf: Prolog=/etc/ftd/slurm/prolog.sh, PrologFlags=Alloc): tell the node's ftd
# agent that a job starts here, so the coordinator knows it even when it does not use ftd.client.
# Budget: FTD_HOOK_TIMEOUT seconds (default 2) to reach the agent. Never fails the job because ftd is
# down: a warning on stderr (slurmd's log) and exit 0 -- unless FTD_PROLOG_GATE=1 (then an agent that
# cannot be told fails the Prolog: Slurm drains the node and requeues the job).
# Settings: /etc/default/ftd-slurm (FTD_BIN, FTD_SOCKET, FTD_HOOK_TIMEOUT, FTD_PROLOG_GATE).
[ -r "${FTD_SLURM_DEFAULTS:-/etc/default/ftd-slurm}" ] && . "${FTD_SLURM_DEFAULTS:-/etc/default/ftd-slurm}"
FTD_BIN=${FTD_BIN:-/opt/ftd/bin/ftd}
T=${FTD_HOOK_TIMEOUT:-2}
if [ ! -x "$FTD_BIN" ]; then
    echo "ftd prolog: WARNING: $FTD_BIN not found; job ${SLURM_JOB_ID:-?} not reported" >&2
    [ "${FTD_PROLOG_GATE:-0}" = 1 ] && exit 1
    exit 0
fi
# FTD_PROLOG_PREFLIGHT=1: run `ftd preflight` first; a failing node (exit 1) and a node it could not
# check at all (exit 3: every check skipped, e.g. NVML failing) fail the Prolog (Slurm drains it and
# requeues the job), unless FTD_PREFLIGHT_ALLOW_UNCHECKED=1. Its checks take time: keep the slow ones
# off in [agent.preflight].
if [ "${FTD_PROLOG_PREFLIGHT:-0}" = 1 ]; then
    "$FTD_BIN" preflight --config "${FTD_AGENT_CONFIG:-/etc/ftd/agent.toml}" \
        $([ "${FTD_PREFLIGHT_ALLOW_UNCHECKED:-0}" = 1 ] && echo --allow-unchecked) >&2 || exit 1
fi
# `timeout` bounds even a hung interpreter start (the command itself waits at most $T for the agent).
timeout -k 1 $((T + 3)) "$FTD_BIN" slurm prolog --timeout "$T" $([ "${FTD_PROLOG_GATE:-0}" = 1 ] && echo --gate)
rc=$?
[ "${FTD_PROLOG_GATE:-0}" = 1 ] && exit $rc
exit 0
