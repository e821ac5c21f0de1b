#!/bin/sh
# Slurm HealthCheckProgram (slurm.conf: HealthCheckProgram=/etc/ftd/slurm/healthcheck.sh,
# HealthCheckInterval=60): ask the node's ftd agent for active critical conditions (an unresolved
# Xid 79, a GPU missing, a full filesystem, GPU processes a job left behind) and drain the node
# through scontrol when one is active -- also while the ftd coordinator is down. NHC-style output.
# Budget: FTD_HEALTH_TIMEOUT seconds in all (default 0.8). An unreachable agent is a warning, exit 0.
# FTD_HEALTH_RESUME=1 resumes a node this check drained once no condition is active.
[ -r "${FTD_SLURM_DEFAULTS:-/etc/default/ftd-slurm}" ] && . "${FTD_SLURM_DEFAULTS:-/etc/default/ftd-slurm}"
FTD_BIN=${FTD_BIN:-/opt/ftd/bin/ftd}
if [ ! -x "$FTD_BIN" ]; then
    echo "WARNING:  ftd:  $FTD_BIN not found" >&2
    exit 0
fi
RESUME=$([ "${FTD_HEALTH_RESUME:-0}" = 1 ] && echo --resume)
# FTD_PYTHON (the interpreter ftd is installed in): start only the health module (~0.05 s) instead
# of the whole CLI (~0.2 s).
if [ -n "${FTD_PYTHON:-}" ] && [ -x "$FTD_PYTHON" ]; then
    exec timeout -k 1 5 "$FTD_PYTHON" -m ftd.commands.health --slurm --timeout "${FTD_HEALTH_TIMEOUT:-0.8}" $RESUME
fi
exec timeout -k 1 5 "$FTD_BIN" health --slurm --timeout "${FTD_HEALTH_TIMEOUT:-0.8}" $RESUME
