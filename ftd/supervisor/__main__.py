"""``python -m ftd.supervisor [options] -- <training command>``: ``ftd run`` where only the trainer-only
install (ftd-daemon-client) is present (:mod:`ftd.supervisor.cli`)."""

from __future__ import annotations

import sys

from ftd.supervisor.cli import main

if __name__ == "__main__":
    sys.exit(main())
