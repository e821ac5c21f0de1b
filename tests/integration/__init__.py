"""Integration tests: like the unit tests, each starts what it needs itself on free ports, so
``make test`` runs them on every core together with ``tests/unit``; but they cost real time: real
processes (``ftd`` commands and the shipped shell hooks as subprocesses, PostgreSQL, PyTorch ranks) or
in-process daemons waiting on wall-clock timeouts. ``make unit`` (the inner loop) leaves them out."""
