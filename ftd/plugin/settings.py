"""The settings the built-in rules read, typed, handed to each rule with the event it decides on.

What: :class:`RuleSettings` holds what an operator's configuration says to the rules -- today the
job-level policy for application faults (:class:`AppFaultPolicy`, from ``policy.app_fault_*``). The
engine builds it once from its own configuration (:meth:`RuleSettings.from_policy`) and passes it
as the ``settings`` argument of ``ftd_evaluate``; a rule that needs it names that argument, one that
does not leaves it out (pluggy passes a hook implementation only the arguments it declares).

Why: a rule stays a pure function of (event, view, settings). The settings used to be a module-level
object that each rule's ``ftd_startup`` overwrote from the coordinator's config (read with
``getattr`` on an untyped object), so two engines in one process -- an HA runner's terms, a replay
beside a coordinator -- decided with whichever configuration was read last.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


class AppFaultOptions(Protocol):
    """The ``policy.app_fault_*`` options as the configuration holds them (``ftd.config.PolicyConfig``
    has them; a structural type, so the rule contract imports nothing of the config)."""

    @property
    def app_fault_restart_limit(self) -> int: ...

    @property
    def app_fault_window_s(self) -> float: ...

    @property
    def app_fault_backoff_s(self) -> float: ...

    @property
    def app_fault_backoff_max_s(self) -> float: ...


@dataclass(frozen=True)
class AppFaultPolicy:
    """The job-level policy for application faults (``policy.app_fault_*``): restart in place with
    crash-loop backoff, and after ``restart_limit`` incidents of one signature within ``window_s``
    notify instead of restarting again."""

    restart_limit: int = 3
    window_s: float = 3600.0
    backoff_s: float = 30.0
    backoff_max_s: float = 600.0

    def delay(self, restarts_before: int) -> float:
        """Crash-loop backoff: none for the first restart, then ``backoff_s`` doubling to the max."""
        if restarts_before <= 0:
            return 0.0
        return float(min(self.backoff_s * 2 ** (restarts_before - 1), self.backoff_max_s))


@dataclass(frozen=True)
class RuleSettings:
    """Everything the configuration says to the rules (the defaults are the config's defaults)."""

    app_faults: AppFaultPolicy = field(default_factory=AppFaultPolicy)

    @classmethod
    def from_policy(cls, policy: AppFaultOptions) -> RuleSettings:
        """The rules' settings of a coordinator whose ``[coordinator.policy]`` is ``policy``."""
        return cls(
            app_faults=AppFaultPolicy(
                restart_limit=policy.app_fault_restart_limit,
                window_s=float(policy.app_fault_window_s),
                backoff_s=float(policy.app_fault_backoff_s),
                backoff_max_s=float(policy.app_fault_backoff_max_s),
            )
        )
