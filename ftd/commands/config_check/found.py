"""What one check of a config found: problems at dotted option paths, and which options to skip.

What: :class:`Found` collects :class:`~ftd.config.errors.Problem` rows; its :meth:`~Found.check`
runs one test on one option's value and records the answer, unless that option (or one it needs)
was left out because its value was invalid (:func:`~ftd.config.validate.valid_part`).

Why its own module: the file and path checks (:mod:`.references`) and the rule checks through the
coordinator's loaders (:mod:`.rules`) fill the same collector, and neither should import the other.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from ftd.config.errors import Problem

__all__ = ["Found"]


class Found:
    """Collects problems; skips checks that depend on an option whose value was invalid (left out)."""

    def __init__(self, unknown: Collection[str]) -> None:
        self.problems: list[Problem] = []
        self._unknown = tuple(unknown)

    def known(self, *options: str) -> bool:
        return not any(
            option == u or option.startswith((u + ".", u + "[")) for option in options for u in self._unknown
        )

    def check(self, option: str, value: str, test: Callable[[str], str | None], *needs: str) -> bool:
        """``test(value)``, reported at ``option``; ``True`` only when it ran and passed (skipped when
        ``option`` or one it ``needs`` was left out)."""
        if not self.known(option, *needs):
            return False
        problem = test(value)
        if problem is not None:
            self.problems.append(Problem(option, problem))
        return problem is None
