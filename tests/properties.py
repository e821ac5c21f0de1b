"""Hypothesis profiles: a quick one for the inner loop, the full one for CI.

The property tests dominate the unit suite's time, and most of it buys little while editing: a
property broken by a change usually fails on its first few examples. So there are two profiles,
registered here and loaded by ``tests/conftest.py`` before any test module is imported:

* ``ci`` -- every test's full example count (the numbers written in the tests), and a failure's
  reproduction blob printed so it can be replayed anywhere with ``@reproduce_failure``. Chosen when
  ``CI`` is set or ``FTD_REQUIRE_REAL=1`` (what ``.ci/run`` exports).
* ``dev`` -- the default elsewhere: a tenth of each count (at least one example). Every property
  still runs and can still fail; it explores less.

Neither profile has Hypothesis' timing checks (the per-example ``deadline``, the ``too_slow`` health
check): on the two-core machine, loaded by the suite itself in CI, they failed correct properties
(``test_event_round_trip``: 7 inputs in 1.1 s at load 14) without saying anything about the code.
Speed is the benches' business, never a unit test's.

``HYPOTHESIS_PROFILE=<name>`` overrides the choice (``HYPOTHESIS_PROFILE=ci make unit`` runs the full
counts locally), as does pytest's ``--hypothesis-profile``.

A test that names its own count writes ``@settings(max_examples=examples(300))``: 300 under ``ci``,
scaled down under ``dev``. A test that names none gets the profile's ``max_examples``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from hypothesis import HealthCheck, settings

#: Hypothesis' own default ``max_examples``: the ``ci`` profile keeps it, so a count written in a
#: test (and a test that writes none) means under ``ci`` exactly what it meant before the profiles.
FULL = 100
#: The ``dev`` profile's ``max_examples``: every count scaled by ``DEV / FULL``.
DEV = 10

#: Hypothesis' timing checks (the 200 ms deadline per example, the too-slow data-generation health
#: check) judge the machine, not the property: on a loaded 2-core CI machine they failed correct tests
#: (test_events' round trip, issue #31's "a test that fails under load is a defect"). Both profiles
#: turn them off; the properties themselves are unchanged.
_UNTIMED = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}

settings.register_profile("ci", max_examples=FULL, print_blob=True, **_UNTIMED)
settings.register_profile("dev", max_examples=DEV, **_UNTIMED)


def profile_name(environ: Mapping[str, str] = os.environ) -> str:
    """``HYPOTHESIS_PROFILE`` when set; else ``ci`` under CI (``CI`` set, or ``FTD_REQUIRE_REAL=1``);
    else ``dev``."""
    explicit = environ.get("HYPOTHESIS_PROFILE", "").strip()
    if explicit:
        return explicit
    ci = environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
    if ci or environ.get("FTD_REQUIRE_REAL") == "1":
        return "ci"
    return "dev"


def load() -> str:
    """Load the profile :func:`profile_name` picks; its name."""
    name = profile_name()
    settings.load_profile(name)
    return name


def examples(full: int) -> int:
    """``full`` examples (the count CI runs) scaled to the loaded profile: ``full`` under ``ci``, a
    tenth under ``dev``; never fewer than one."""
    return max(1, round(full * settings().max_examples / FULL))
