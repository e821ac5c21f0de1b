"""The agent's local API: the unix socket that training ranks and node hooks on this node talk to.

Layout: :mod:`ftd.agent.local_api.server` (the :class:`LocalApi` server: connections, ranks,
pending directives, acks, presence, hooks), :mod:`ftd.agent.local_api.wire` (this end of the
trainer protocol: typed messages in, lines out), :mod:`ftd.agent.local_api.registration` (who may
connect and register for which job), :mod:`ftd.agent.local_api.supervising` (the rank supervisors'
protocol, ``ftd run``) over :mod:`ftd.agent.local_api.supervisors` (their book),
:mod:`ftd.agent.local_api.owners` (whose process a pid is) and :mod:`ftd.agent.local_api.state` (the
per-connection records). This face re-exports what the agent, the benchmarks and the tests import.
"""

from __future__ import annotations

from ftd.agent.local_api.registration import socket_gid
from ftd.agent.local_api.server import LocalApi
from ftd.client.protocol import MAX_LINE, PROTOCOL_VERSION

__all__ = ["MAX_LINE", "PROTOCOL_VERSION", "LocalApi", "socket_gid"]
