"""Who leads: the HA status a replica keeps (``/metrics``, ``GET /v1/ha``, ``ftd status``).

A plain record at the coordinator's ground floor: the HA runner (:mod:`ftd.coordinator.ha.runner`)
writes it, the daemon carries it and the APIs read it, none of them importing the others for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric


@dataclass
class HaStatus:
    """Who leads, as this replica knows it (``/metrics``, ``GET /v1/ha``, ``ftd status``)."""

    identity: str
    role: str = "standby"  # standby | leader
    epoch: int | None = None  # this replica's term while it leads
    leader: str | None = None  # the lease holder as last read
    leader_epoch: int = 0
    lease_age_s: float | None = None  # since the holder's last renewal
    lease_expires_in_s: float | None = None
    terms: int = 0  # terms this replica has led
    takeovers: list[float] = field(default_factory=list)  # wall time each term began
    database_ok: bool = True

    def metrics(self) -> Iterator[Metric]:
        """Prometheus gauges: leader (1 on the replica that leads), epoch, lease age."""
        leader = GaugeMetricFamily(
            "ftd_ha_leader", "1 while this coordinator holds the lease, else 0.", labels=["identity"]
        )
        leader.add_metric([self.identity], 1.0 if self.role == "leader" else 0.0)
        yield leader
        yield GaugeMetricFamily(
            "ftd_ha_epoch", "The lease epoch (fencing token) as last read.", value=self.leader_epoch
        )
        yield GaugeMetricFamily(
            "ftd_ha_lease_age_seconds",
            "Seconds since the leader last renewed the lease (as last read).",
            value=self.lease_age_s if self.lease_age_s is not None else float("nan"),
        )
        yield GaugeMetricFamily("ftd_ha_terms", "Terms this coordinator has led.", value=self.terms)

    def as_dict(self) -> dict[str, Any]:
        return {
            "identity": self.identity,
            "role": self.role,
            "epoch": self.epoch,
            "leader": self.leader,
            "leader_epoch": self.leader_epoch,
            "lease_age_s": self.lease_age_s,
            "lease_expires_in_s": self.lease_expires_in_s,
            "terms": self.terms,
            "database_ok": self.database_ok,
        }
