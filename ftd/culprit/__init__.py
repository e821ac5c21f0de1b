"""Find the culprit (issue #33): what a hang or a slowdown that names nothing leaves behind, and the
verdict drawn from it.

Pure code only, shared by the agent (which collects the evidence) and the coordinator (which fuses it
into a verdict and acts on it): no I/O, no bus, no asyncio. :mod:`ftd.culprit.evidence` holds the wire
shapes: one rank's, one node's and one job's evidence, and the verdict drawn from them.
"""
