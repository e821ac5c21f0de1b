"""ftd: fault-tolerance daemon for GPU training clusters.

Only the version lives here so that ``import ftd.client`` inside a training process stays light.
"""

__version__ = "0.1.0"
