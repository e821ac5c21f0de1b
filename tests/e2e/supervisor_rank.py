"""A rank for the ``ftd run`` tests: writes its environment (and whether ``warm_marker`` was already
imported when it started) to ``$OUT_DIR/g<generation>-r<rank>.json``, then sleeps (``RANK_MODE``
``sleep``, the default), exits with ``$RANK_EXIT`` (``exit``), or exits 0 once the file
``$OUT_DIR/exit-g<generation>`` exists (``exit_on_file``: a rank that saved and stopped), or sleeps
ignoring SIGTERM (``ignore_term``)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

KEYS = [
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "FTD_RUN",
    "FTD_GENERATION",
    "FTD_JOB_ID",
    "FTD_RESUME_STEP",
    "FTD_RESUME_LEVEL",
    "FTD_RESUME_PATH",
    "FTD_SOCKET",
    "FTD_WARM_READY_AT",
]

if os.environ.get("RANK_MODE") == "ignore_term":  # deaf to SIGTERM (before the record says it is up)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
record: dict[str, object] = {k: os.environ.get(k) for k in KEYS}
record["pid"] = os.getpid()
record["started"] = time.time()
marker = sys.modules.get("warm_marker")
record["warm_marker_imported_at"] = getattr(marker, "IMPORTED_AT", None)
name = f"g{record['FTD_GENERATION']}-r{record['RANK']}.json"
tmp = os.path.join(os.environ["OUT_DIR"], "." + name)
with open(tmp, "w") as f:
    json.dump(record, f)
os.replace(tmp, os.path.join(os.environ["OUT_DIR"], name))
mode = os.environ.get("RANK_MODE", "sleep")
if mode == "exit":
    sys.exit(int(os.environ.get("RANK_EXIT", "0")))
if mode == "exit_on_file":  # exit 0 once $OUT_DIR/exit-g<generation> exists (a rank told to stop)
    flag = os.path.join(os.environ["OUT_DIR"], f"exit-g{record['FTD_GENERATION']}")
    while not os.path.exists(flag):
        time.sleep(0.05)
    sys.exit(0)
time.sleep(3600)
