"""The fabric watcher (issue #35): IB/RoCE/NVLink counters as rates, PCIe links, IB port rates.

Modules: :mod:`.sysfs` (the ports, counters, network devices and PCIe links as the kernel's files
say them), :mod:`.ethtool` (a RoCE port's ``*_phy`` counters), :mod:`.state` (counter histories and
open conditions across agent restarts), :mod:`.watcher` (:class:`FabricWatcher`: reads, judges
against the hardware profile through :mod:`ftd.fabric`, emits). docs/fabric.md lists each check.
"""

from ftd.agent.watchers.fabric.watcher import FabricWatcher

__all__ = ["FabricWatcher"]
