#!/bin/sh
# Slurm Epilog (slurm.conf: Epilog=/etc/ftd/slurm/epilog.sh): tell the node's ftd agent that a job
# ended here, with the job's processes still alive (the "Kill task failed" case: processes carrying
# the job's SLURM_JOB_ID; those nvidia-smi lists as holding a GPU are marked), which the agent reports
# as a job_leftover event (GPU holders also keep `ftd health` failing until they are gone).
# Budget: FTD_HOOK_TIMEOUT seconds (default 2) for the agent, 2 s for nvidia-smi. Always exits 0:
# a failing Epilog would drain the node for ftd's sake; ftd health drains it with a readable reason.
[ -r "${FTD_SLURM_DEFAULTS:-/etc/default/ftd-slurm}" ] && . "${FTD_SLURM_DEFAULTS:-/etc/default/ftd-slurm}"
FTD_BIN=${FTD_BIN:-/opt/ftd/bin/ftd}
T=${FTD_HOOK_TIMEOUT:-2}
if [ ! -x "$FTD_BIN" ]; then
    echo "ftd epilog: WARNING: $FTD_BIN not found; end of job ${SLURM_JOB_ID:-?} not reported" >&2
    exit 0
fi
timeout -k 1 $((T + 5)) "$FTD_BIN" slurm epilog --timeout "$T"
exit 0
