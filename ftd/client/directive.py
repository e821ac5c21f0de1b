"""What the client keeps of a directive from the agent, and the step a set of saves asks for.

What: :class:`DirectiveInfo` (one ``save``/``stop`` this rank received) and :func:`save_at` (the
step at which the pending saves want the checkpoint). Why apart: both are plain data shared by the
I/O thread that receives directives and the :class:`~ftd.client.Client` methods that answer them.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not imported from typing: keeps `import ftd.client` light
if TYPE_CHECKING:
    from typing import Any

__all__ = ["DEADLINE_REASON", "DirectiveInfo", "save_at"]

DEADLINE_REASON = "save not completed within deadline"
"""The nack the I/O thread sends for a save still unanswered past its ``deadline_s``."""


class DirectiveInfo:
    """A directive this rank received (``action`` is ``"save"`` or ``"stop"``).

    ``received_ns`` is ``time.perf_counter_ns()`` when it arrived. (A plain class, not a dataclass:
    ``dataclasses`` imports ``inspect``, which would double this module's import time.)
    """

    __slots__ = ("action", "deadline_s", "id", "job", "params", "reason", "received_ns")

    def __init__(
        self,
        id: str,
        action: str,
        reason: str = "",
        job: str | None = None,
        deadline_s: float | None = None,
        params: dict[str, Any] | None = None,
        received_ns: int = 0,
    ) -> None:
        self.id = id
        self.action = action
        self.reason = reason
        self.job = job
        self.deadline_s = deadline_s
        self.params = params if params is not None else {}
        self.received_ns = received_ns

    def __repr__(self) -> str:
        return f"DirectiveInfo(id={self.id!r}, action={self.action!r}, reason={self.reason!r})"


def save_at(saves: dict[str, DirectiveInfo]) -> int | None:
    """The step to save at for the pending save directives: the furthest ``save_at_step`` they ask
    for (one checkpoint answers them all), or None (at once) when any of them names none."""
    targets = [info.params.get("save_at_step") for info in saves.values()]
    if not targets or any(not isinstance(t, int) or isinstance(t, bool) for t in targets):
        return None
    return max(t for t in targets if isinstance(t, int))
