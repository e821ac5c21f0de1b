"""The skip hooks (tests/skips.py), run on small test files of their own through pytester: under
``FTD_REQUIRE_REAL=1`` every kind of skip fails unless its reason is a missing GPU; without it skips
stay skips."""

from __future__ import annotations

import pytest

from tests.skips import GPU_HERE, NO_GPU, allowed

pytest_plugins = ["pytester"]

# One file per kind of skip a test can take; each would be silent in CI without the hook.
SKIPS = {
    "test_call_skip": "import pytest\n\ndef test_it():\n    pytest.skip('node is not installed')\n",
    "test_skipif_mark": (
        "import pytest\n\n@pytest.mark.skipif(True, reason='strace missing')\ndef test_it():\n    pass\n"
    ),
    "test_skip_mark": "import pytest\n\n@pytest.mark.skip\ndef test_it():\n    pass\n",
    "test_fixture_skip": (
        "import pytest\n\n@pytest.fixture\ndef part():\n    pytest.skip('needs root')\n\n"
        "def test_it(part):\n    pass\n"
    ),
    "test_importorskip": (
        "import pytest\n\npytest.importorskip('ftd_no_such_module_31')\n\ndef test_it():\n    pass\n"
    ),
    "test_module_skip": (
        "import pytest\n\npytest.skip('no torch', allow_module_level=True)\n\ndef test_it():\n    pass\n"
    ),
}

GPU_SKIPS = {
    "test_no_gpu": (
        "from tests.skips import skip_without_gpu\n\ndef test_it():\n    skip_without_gpu('NVML absent')\n"
    ),
    "test_gpu_here": (
        "import pytest\nfrom tests.skips import GPU_HERE\n\n"
        "@pytest.mark.skipif(True, reason=GPU_HERE + 'NVML works')\ndef test_it():\n    pass\n"
    ),
}


def run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, source: str, *, ci: bool
) -> pytest.RunResult:
    if ci:
        monkeypatch.setenv("FTD_REQUIRE_REAL", "1")
    else:
        monkeypatch.delenv("FTD_REQUIRE_REAL", raising=False)
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(test_case=source)
    return pytester.runpytest_inprocess(
        "-p", "tests.skips", "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning"
    )


@pytest.mark.parametrize("name", sorted(SKIPS))
def test_a_skip_fails_under_require_real(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    result = run(pytester, monkeypatch, SKIPS[name], ci=True)
    if name == "test_call_skip":
        result.assert_outcomes(failed=1)
    else:  # a skip in set-up (a mark, a fixture) or while the module is collected: an error
        result.assert_outcomes(errors=1)
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*FTD_REQUIRE_REAL=1 and this skip is not on the allow-list*"])


@pytest.mark.parametrize("name", sorted(SKIPS))
def test_a_skip_stays_a_skip_without_require_real(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    result = run(pytester, monkeypatch, SKIPS[name], ci=False)
    result.assert_outcomes(skipped=1)
    assert result.ret in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)  # a whole module skipped


@pytest.mark.parametrize("name", sorted(GPU_SKIPS))
def test_a_missing_gpu_may_skip_under_require_real(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    result = run(pytester, monkeypatch, GPU_SKIPS[name], ci=True)
    result.assert_outcomes(skipped=1)
    assert result.ret == 0


def test_passes_failures_and_xfails_are_left_alone(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = (
        "import pytest\n\ndef test_pass():\n    pass\n\ndef test_fail():\n    assert False\n\n"
        "@pytest.mark.xfail(reason='known')\ndef test_xfail():\n    assert False\n"
    )
    result = run(pytester, monkeypatch, source, ci=True)
    result.assert_outcomes(passed=1, failed=1, xfailed=1)


def test_the_allow_list_is_the_gpu_only() -> None:
    assert allowed(NO_GPU + "x") and allowed("Skipped: " + GPU_HERE + "x")
    assert not allowed("needs a GPU maybe") and not allowed("Skipped: node is not installed")
    assert not allowed("could not import 'torch': " + NO_GPU)  # the prefix, not anywhere in it
