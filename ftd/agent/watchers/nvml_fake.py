"""Old home of the scriptable NVML backend, now :mod:`ftd.agent.watchers.nvml.fake`.

Kept only because ``ftd/bench/agent.py`` still imports ``FakeNvml`` from here; remove this module
once that import points at the new home.
"""

from __future__ import annotations

from ftd.agent.watchers.nvml.fake import FakeGpu, FakeNvml

__all__ = ["FakeGpu", "FakeNvml"]
