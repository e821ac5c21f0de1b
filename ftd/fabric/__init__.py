"""Fabric health (issue #35): pure judgement of links, ports and node pairs that both daemons share.

What: counters turned into rates and judged against a hardware profile's thresholds; PCIe and port
link states against their capability; pair-test results against the profile's expected bandwidth and
the fleet's baseline; the choice of the next pair to test when a bisection hunts a degraded node.
Why here: the agent reads the files and runs the tests, the coordinator schedules and decides; the
judgement in between is one piece of code with no I/O, so both give the same answer.
"""
