"""The hardware catalog: profiles matched by GPU name, sections merged default-then-profile, overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from ftd.catalog.hardware_profiles import HardwareCatalogError, load_hardware_catalog


def test_gpu_names_pick_the_profile_and_unknown_gpus_pick_none() -> None:
    catalog = load_hardware_catalog()
    assert catalog.profile_for_gpu("NVIDIA H100 80GB HBM3") == "h100-sxm"
    assert catalog.profile_for_gpu("NVIDIA H200") == "h200-sxm"
    assert catalog.profile_for_gpu("NVIDIA A100-SXM4-80GB") == "a100-sxm"
    assert catalog.profile_for_gpu("Tesla T4") is None


def test_unknown_profile_has_no_section_and_a_known_one_gets_the_defaults(tmp_path: Path) -> None:
    extra = tmp_path / "site.toml"
    extra.write_text(
        '[profiles.t4-box]\ngpu_names = ["T4"]\n'
        "[probe.default]\nlimit = 5\nwindow = 10\n"
        "[probe.t4-box]\nlimit = 7\n"
    )
    catalog = load_hardware_catalog(extra)
    assert catalog.profile_for_gpu("Tesla T4") == "t4-box"
    assert catalog.section("probe", "t4-box") == {"limit": 7, "window": 10}
    assert catalog.section("probe", "h100-sxm") == {"limit": 5, "window": 10}
    assert catalog.section("probe", "no-such-profile") is None
    assert catalog.section("probe", None) is None
    # the packaged catalog is not changed by an operator's file
    assert load_hardware_catalog().section("probe", "h100-sxm") == {}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[profiles.x]\ngpu_names = [1]\n", "profiles.x.gpu_names"),
        ("[profiles]\nx = 3\n", "profiles.x: expected a table"),
        ("probe = 3\n", "probe: expected a table"),
        ("[probe\n", "site.toml"),
    ],
)
def test_a_bad_operator_file_names_the_file_and_key(tmp_path: Path, text: str, says: str) -> None:
    extra = tmp_path / "site.toml"
    extra.write_text(text)
    with pytest.raises(HardwareCatalogError, match=says.replace(".", r"\.").replace("[", r"\[")):
        load_hardware_catalog(extra)


def test_a_missing_operator_file_is_an_error_that_names_it(tmp_path: Path) -> None:
    with pytest.raises(HardwareCatalogError, match="cannot read"):
        load_hardware_catalog(tmp_path / "absent.toml")
