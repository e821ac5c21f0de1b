"""A training rank that registers with the agent through the trainer client, heartbeats, and segfaults
for real (a NULL read through ctypes) once ``$FTD_TEST_CRASH`` exists; used by the one-door e2e test.

Environment: ``FTD_SOCKET``, ``FTD_TEST_JOB``, ``FTD_TEST_RANK``, ``FTD_TEST_CRASH`` (a path). It
prints ``registered <pid>`` on stdout once the agent accepted it.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time

from ftd.client import Client


def main() -> int:
    crash = os.environ["FTD_TEST_CRASH"]
    client = Client(job=os.environ["FTD_TEST_JOB"], rank=int(os.environ["FTD_TEST_RANK"]))
    deadline = time.monotonic() + 30
    while not client.connected:
        if time.monotonic() > deadline:
            print("not registered", flush=True)
            return 2
        time.sleep(0.05)
    print(f"registered {os.getpid()}", flush=True)
    step = 0
    deadline = time.monotonic() + float(os.environ.get("FTD_TEST_MAX_S", "120"))
    while time.monotonic() < deadline:
        step += 1
        client.heartbeat(step)
        if os.path.exists(crash):
            ctypes.string_at(0)  # SIGSEGV: the process dies as a rank in a GPU library would
        time.sleep(0.05)
    return 1


if __name__ == "__main__":
    sys.exit(main())
