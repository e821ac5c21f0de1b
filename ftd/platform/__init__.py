"""Platform truth (issue #36): pure judgement of what a node runs and of a job's communication path.

What: the inventory's wire shape, drift between a node and the peers of its hardware profile,
minimum versions, NCCL init output read for the transport it chose, the RDMA environment's verdicts,
the burn-in's report. Why here: the agent collects the facts and the coordinator compares nodes; the
comparisons are pure code both share, with every unreadable fact kept as unknown with its reason.
"""
