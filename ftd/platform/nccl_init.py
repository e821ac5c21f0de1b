"""Which transport NCCL chose, read from its ``NCCL_DEBUG=INFO`` init output.

What: :func:`sighting` reads one line of a rank's output and says what it shows about the network
transport NCCL picked for the job's inter-node traffic; :class:`NcclTransport` folds the sightings of
a job into one answer. The lines (NCCL 2.x, ``NCCL_DEBUG=INFO``)::

    host:123:456 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB eth0:10.0.0.1<0>
    host:123:456 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>
    host:123:456 [0] NCCL INFO Using network IB          (or: Using network Socket)
    host:123:456 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA
    host:123:456 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0

Why it matters: on an InfiniBand cluster a job whose NCCL fell back to ``NET/Socket`` trains several
times slower and says nothing else about it; ``via NET/IB/...`` without ``GDRDMA`` means GPUDirect
RDMA is off (staged through host memory). Pure code: the agent feeds it its log lines.

Lines not about the network (intra-node ``via P2P/IPC``, ``via SHM``) say nothing here and are ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["NcclTransport", "Sighting", "sighting"]

Net = Literal["ib", "socket", "other"]

_NET_PLUGIN = re.compile(r"NCCL INFO NET/(IB|Socket|[A-Za-z0-9_]+)\s*:\s*Using\s+(.{0,200})")
_USING = re.compile(r"NCCL INFO Using network (\S{1,40})")
_CHANNEL = re.compile(
    r"NCCL INFO Channel \d+/\d+ : .{0,80}? via NET/([A-Za-z0-9_]+)((?:/[A-Za-z0-9_]+){0,4})"
)
_DEVICE = re.compile(r"\[\d+\]([A-Za-z0-9_.:/\-]{1,64})")


def _net(name: str) -> Net:
    low = name.lower()
    if low == "ib":
        return "ib"
    if low == "socket":
        return "socket"
    return "other"


@dataclass(frozen=True)
class Sighting:
    """What one line shows: the network (``ib``/``socket``/``other``: a plugin such as AWS OFI),
    whether GPUDirect RDMA was used on a channel (None: the line does not say), devices named."""

    net: Net
    plugin: str
    gdrdma: bool | None = None
    devices: tuple[str, ...] = ()


def sighting(line: str) -> Sighting | None:
    """What ``line`` shows about NCCL's network transport, or None when it shows nothing."""
    if "NCCL INFO" not in line:
        return None
    line = line[:2000]
    match = _CHANNEL.search(line)
    if match is not None:
        flags = match.group(2).split("/")
        return Sighting(_net(match.group(1)), match.group(1), gdrdma="GDRDMA" in flags)
    match = _NET_PLUGIN.search(line)
    if match is not None:
        devices = tuple(_DEVICE.findall(match.group(2).split(";")[0]))[:16]
        return Sighting(_net(match.group(1)), match.group(1), devices=devices)
    match = _USING.search(line)
    if match is not None:
        return Sighting(_net(match.group(1)), match.group(1))
    return None


@dataclass
class NcclTransport:
    """The sightings of one job folded: the networks seen, and whether any channel used GDRDMA."""

    nets: set[str] = field(default_factory=set)
    plugins: set[str] = field(default_factory=set)
    devices: set[str] = field(default_factory=set)
    channels_gdrdma: int = 0
    channels_staged: int = 0
    lines: int = 0

    def add(self, seen: Sighting) -> bool:
        """Fold ``seen`` in; True when it changed the answer (a new network or the first channel)."""
        before = (frozenset(self.nets), self.channels_gdrdma > 0, self.channels_staged > 0)
        self.lines += 1
        self.nets.add(seen.net)
        self.plugins.add(seen.plugin)
        self.devices.update(seen.devices)
        if seen.gdrdma is True:
            self.channels_gdrdma += 1
        elif seen.gdrdma is False:
            self.channels_staged += 1
        return before != (frozenset(self.nets), self.channels_gdrdma > 0, self.channels_staged > 0)

    @property
    def known(self) -> bool:
        return bool(self.nets)

    @property
    def on_socket(self) -> bool:
        return "socket" in self.nets

    def to_dict(self) -> dict[str, object]:
        return {
            "nets": sorted(self.nets),
            "plugins": sorted(self.plugins),
            "devices": sorted(self.devices)[:16],
            "channels_gdrdma": self.channels_gdrdma,
            "channels_staged": self.channels_staged,
        }
