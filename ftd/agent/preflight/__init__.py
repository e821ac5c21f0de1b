"""Node preflight checks (``ftd preflight``; the agent's ``preflight`` directive for return to service).

:mod:`ftd.agent.preflight.checks` holds one function per check, :mod:`ftd.agent.preflight.runner`
runs them in order and turns them into one verdict with a one-line reason.

Why inside the agent: the checks read the node through the agent's own NVML backend
(:mod:`ftd.agent.watchers.nvml`) and the agent runs them on a directive, so they sit on the agent's
floor; ``ftd preflight`` (a command, one floor up) runs the same runner by hand.
"""
