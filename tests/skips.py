"""Which skips CI allows, and the pytest hooks that turn every other skip into a failure.

What: under ``FTD_REQUIRE_REAL=1`` (CI) a test, a ``skipif`` mark, a fixture or a module-level
``importorskip`` that skips for a reason not on :data:`ALLOWED` fails instead, with the reason and
where the allow-list lives. The allow-list is short on purpose: the hardware CI machines lack, a GPU
(docs/architecture.md §12 Testing). A GPU test skips through :func:`skip_without_gpu` (or names
:data:`NO_GPU` / :data:`GPU_HERE` in its reason), so the reason says which entry lets it through.

Why centrally: issue #31 found 21 skip sites that ignored ``FTD_REQUIRE_REAL=1`` (``importorskip("torch")``,
``node`` not installed, ...); each site had to remember the rule, and a forgotten one was a silent skip
in CI. One hook in ``tests/conftest.py`` sees every skip, so a new site cannot forget. Outside CI
skips stay skips (a laptop without Slurm or Node.js runs what it can).
"""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import NoReturn

import pytest

#: A test that needs an NVIDIA GPU (and NVML) on a machine without one.
NO_GPU = "no GPU here: "
#: A test of the path taken without NVML, on a machine where NVML works (a GPU node).
GPU_HERE = "a GPU here: "
#: The reasons a skip may give under ``FTD_REQUIRE_REAL=1``, as prefixes. Keep it to the GPU.
ALLOWED = (NO_GPU, GPU_HERE)

#: pytest's prefix on a skip's message in a report.
_SKIPPED = "Skipped: "


def require_real() -> bool:
    """``FTD_REQUIRE_REAL=1``: read when asked (a pytester run sets it per test)."""
    return os.environ.get("FTD_REQUIRE_REAL") == "1"


def skip_without_gpu(why: str) -> NoReturn:
    """Skip a GPU test where there is no GPU: the one skip CI allows."""
    __tracebackhide__ = True  # the skip is reported at the test's line, not here
    pytest.skip(NO_GPU + why)


def allowed(reason: str) -> bool:
    """Whether a skip's reason (with or without pytest's ``Skipped:``) is on the allow-list."""
    text = reason.removeprefix(_SKIPPED)
    return text.startswith(ALLOWED)


def refusal(reason: str) -> str:
    """The failure a refused skip becomes."""
    return (
        f"FTD_REQUIRE_REAL=1 and this skip is not on the allow-list (tests/skips.py ALLOWED: a missing "
        f"GPU only; docs/architecture.md §12): {reason.removeprefix(_SKIPPED)}"
    )


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def enforce(report: pytest.TestReport | pytest.CollectReport) -> None:
    """Turn ``report`` from a skip into a failure when CI requires real parts and the reason is
    not allowed. An expected failure (``xfail``) is not a skip and is left alone."""
    if not (report.skipped and require_real()) or hasattr(report, "wasxfail"):
        return
    reason = _skip_reason(report)
    if allowed(reason):
        return
    report.outcome = "failed"
    report.longrepr = refusal(reason)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport() -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A test's skip (``pytest.skip``, a ``skip``/``skipif`` mark, a fixture's skip)."""
    report = yield
    enforce(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report() -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    """A module's skip while collected (``pytest.importorskip`` or ``skip(allow_module_level=True)``)."""
    report = yield
    enforce(report)
    return report
