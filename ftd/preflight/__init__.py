"""Node preflight checks (``ftd preflight``; the agent's ``preflight`` directive for return to service).

:mod:`ftd.preflight.checks` holds one function per check, :mod:`ftd.preflight.runner` runs them in
order and turns them into one verdict with a one-line reason.
"""
