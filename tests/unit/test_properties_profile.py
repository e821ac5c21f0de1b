"""The Hypothesis profiles of :mod:`tests.properties`: which one is chosen, what ``examples`` scales
to, and that every count written in a test goes through ``examples`` (a bare ``max_examples=400``
ignores the ``dev`` profile and costs the inner loop its full count: two such tests took 5 s of
``make unit`` before they were caught)."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import HealthCheck, settings

from tests.properties import examples, profile_name

REPO = Path(__file__).resolve().parents[2]
# ``max_examples=`` followed by anything but a call of ``examples`` or a name (a module constant
# such as ``MAX_EXAMPLES = examples(50)`` is checked where it is assigned).
BARE_COUNT = re.compile(r"max_examples\s*=(?!=)(?!\s*(?:examples\(|[A-Za-z_]))")
BARE_CONSTANT = re.compile(r"^\w*MAX_EXAMPLES\s*=(?!\s*examples\()", re.MULTILINE)


def test_the_profile_follows_the_environment() -> None:
    assert profile_name({}) == "dev"
    assert profile_name({"CI": "true"}) == "ci"
    assert profile_name({"CI": "0"}) == "dev"
    assert profile_name({"FTD_REQUIRE_REAL": "1"}) == "ci"
    assert profile_name({"CI": "1", "HYPOTHESIS_PROFILE": "dev"}) == "dev"


def test_examples_scales_with_the_loaded_profile_and_never_reaches_zero() -> None:
    chosen = settings.get_current_profile_name()
    try:
        settings.load_profile("ci")
        assert examples(300) == 300
        settings.load_profile("dev")
        assert examples(300) == 30
        assert examples(4) == 1
    finally:
        settings.load_profile(chosen)


def test_no_profile_fails_a_property_for_the_machines_speed() -> None:
    for name in ("dev", "ci"):
        profile = settings.get_profile(name)
        assert HealthCheck.too_slow in profile.suppress_health_check
        assert profile.deadline is None
    # the other health checks (data too large, filtered too much, ...) still judge the tests
    assert HealthCheck.filter_too_much not in settings.get_profile("ci").suppress_health_check


def _sources() -> list[Path]:
    roots = [REPO / "tests", REPO / "plugins"]
    return sorted(p for root in roots for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_count_written_in_a_test_is_scaled_by_the_profile() -> None:
    sources = _sources()
    assert any(p.name == "test_in_allocation_choice.py" for p in sources)  # the scan sees the tests
    bare = [
        f"{path.relative_to(REPO)}:{text.count(chr(10), 0, match.start()) + 1}"
        for path in sources
        for text in [path.read_text()]
        for pattern in (BARE_COUNT, BARE_CONSTANT)
        for match in pattern.finditer(text)
        if path != Path(__file__).resolve()
    ]
    assert bare == [], "write max_examples=examples(N) (tests/properties.py): " + ", ".join(bare)


def test_the_check_catches_a_bare_count() -> None:
    assert BARE_COUNT.search("@settings(max_examples=400, deadline=None)")
    assert BARE_CONSTANT.search("MAX_EXAMPLES = 50\n")
    assert not BARE_COUNT.search("@settings(max_examples=examples(400))")
    assert not BARE_COUNT.search("settings(max_examples=MAX_EXAMPLES)")
    assert not BARE_COUNT.search("assert settings().max_examples == 10")
    assert not BARE_CONSTANT.search("MAX_EXAMPLES = examples(50)  # per operation\n")
