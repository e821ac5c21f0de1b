"""What a config that cannot be used raises: :class:`ConfigError`, carrying every :class:`Problem`.

What: a problem is a dotted path (``coordinator.policy.cooldown_s``) and a message, plus a line and
column for TOML syntax errors; the error renders them one per line as ``source: path: message``.

Why a module of its own: loading (:mod:`ftd.config.validate`) and reading secret files
(:mod:`ftd.config.credentials`) both raise it, and most importers only catch it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ConfigError", "Problem"]


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a config. ``path`` is dotted (``coordinator.policy.cooldown_s``), or ``""``
    for the file as a whole; ``line``/``column`` (1-based) are known for TOML syntax errors only."""

    path: str
    message: str
    line: int | None = None
    column: int | None = None

    def render(self, source: str) -> str:
        if self.line is not None:
            where = f"{source}:{self.line}" + (f":{self.column}" if self.column is not None else "")
            return f"{where}: {self.message}"
        if self.path:
            return f"{source}: {self.path}: {self.message}"
        return f"{source}: {self.message}"


class ConfigError(ValueError):
    """A config that cannot be used. ``problems`` holds every problem found; ``str()`` lists them all,
    one per line, as ``source: path: message``."""

    def __init__(self, problems: Sequence[Problem], source: str = "<string>") -> None:
        self.problems: list[Problem] = list(problems)
        self.source = source
        super().__init__(self.__str__())

    def __str__(self) -> str:
        return "\n".join(p.render(self.source) for p in self.problems)

    def report(self) -> str:
        """What ``ftd check-config`` and the daemons print on stderr: every problem, then their count."""
        count = len(self.problems)
        return f"{self}\n{count} problem{'s' if count != 1 else ''} in {self.source}"

    def __reduce__(self) -> tuple[Any, ...]:  # keep problems across pickling (multiprocessing)
        return (type(self), (self.problems, self.source))
