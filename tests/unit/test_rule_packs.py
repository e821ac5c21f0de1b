"""``coordinator.rules_file`` as several rule packs: a list of TOML files and/or directories of packs.

The shipped packs in ``rules/`` used to be concatenated into one file because ``rules_file`` took
one path. Now it takes one path or a list; a directory stands for its ``*.toml`` packs (sorted by
name). A rule name declared in two packs is an error naming both files, and a missing pack is a
config error at its own dotted path (``coordinator.rules_file[1]``) naming the file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ftd.commands.config_check import check_config_file
from ftd.config import ConfigError, parse_config
from ftd.coordinator.decide.declarative import DeclarativeError, load_rule_packs, pack_files
from ftd.coordinator.decide.plugins import PluginError, describe_plugins, make_plugin_manager

REPO = Path(__file__).resolve().parents[2]


def pack(path: Path, *names: str) -> Path:
    path.write_text(
        "".join(
            f'[[rule]]\nname = "{name}"\nmatch = {{ kind = "xid" }}\naction = "notify"\n\n' for name in names
        )
    )
    return path


def config(tmp_path: Path, rules_file: str) -> Path:
    path = tmp_path / "ftd.toml"
    path.write_text(
        f'[coordinator]\nledger_path = "{tmp_path}/ledger.sqlite"\nscheduler = "none"\n'
        f"rules_file = {rules_file}\n[coordinator.api]\nenabled = false\n"
    )
    return path


def test_two_packs_load_side_by_side_each_rule_naming_its_pack(tmp_path: Path) -> None:
    a, b = pack(tmp_path / "a.toml", "one", "two"), pack(tmp_path / "b.toml", "three")
    pm = make_plugin_manager(rules_file=[str(a), b], entry_points=False, builtins=False)
    origins = {info.name: info.origin for info in describe_plugins(pm) if info.source == "declarative"}
    assert origins == {"toml:one": str(a), "toml:two": str(a), "toml:three": str(b)}
    cfg = check_config_file(config(tmp_path, f'["{a}", "{b}"]'), roles=("coordinator",)).config
    assert cfg.coordinator.rules_file == [str(a), str(b)]


def test_a_single_string_is_still_one_pack(tmp_path: Path) -> None:
    a = pack(tmp_path / "a.toml", "one")
    assert parse_config(f'[coordinator]\nrules_file = "{a}"\n').coordinator.rules_file == str(a)
    assert [rule.name for rule in load_rule_packs(str(a))] == ["one"]


def test_a_directory_loads_every_pack_sorted_by_name(tmp_path: Path) -> None:
    packs = tmp_path / "packs"
    packs.mkdir()
    pack(packs / "20-late.toml", "late")
    pack(packs / "10-early.toml", "early")
    pack(packs / "_draft.toml", "draft")  # skipped like rule_dirs' _files
    (packs / "README.md").write_text("not a pack\n")
    assert [p.name for p in pack_files(packs)] == ["10-early.toml", "20-late.toml"]
    assert [rule.name for rule in load_rule_packs([packs])] == ["early", "late"]
    check_config_file(config(tmp_path, f'"{packs}"'), roles=("coordinator",))


def test_the_shipped_rules_directory_loads_as_packs() -> None:
    """``rules/`` itself can be named: its packs need no concatenation."""
    names = [rule.source for rule in load_rule_packs(REPO / "rules")]
    assert {Path(source).name for source in names} == {p.name for p in (REPO / "rules").glob("*.toml")}


def test_a_rule_name_in_two_packs_is_an_error_naming_both_files(tmp_path: Path) -> None:
    a, b = pack(tmp_path / "a.toml", "same", "other"), pack(tmp_path / "b.toml", "same")
    with pytest.raises(DeclarativeError) as caught:
        load_rule_packs([a, b])
    assert f"rule 'same' is declared in {a} and again in {b}" in str(caught.value)
    with pytest.raises(PluginError, match=r"rule 'same' is declared in .*a\.toml and again in .*b\.toml"):
        make_plugin_manager(rules_file=[a, b], entry_points=False, builtins=False)
    with pytest.raises(ConfigError) as refused:
        check_config_file(config(tmp_path, f'["{a}", "{b}"]'), roles=("coordinator",))
    [problem] = refused.value.problems
    assert problem.path == "coordinator.rules_file"
    assert str(a) in problem.message and str(b) in problem.message


def test_a_pack_loaded_twice_is_one_clear_error(tmp_path: Path) -> None:
    packs = tmp_path / "packs"
    packs.mkdir()
    a = pack(packs / "a.toml", "one", "two")
    with pytest.raises(DeclarativeError) as caught:
        load_rule_packs([packs, a])  # the directory, then one of its files again
    assert caught.value.problems == [
        f"the pack {a} is loaded twice (named twice in coordinator.rules_file, or as a file and through "
        "its directory)"
    ]


def test_a_missing_pack_is_a_config_error_at_its_entry_naming_the_file(tmp_path: Path) -> None:
    a = pack(tmp_path / "a.toml", "one")
    missing = tmp_path / "missing.toml"
    with pytest.raises(ConfigError) as refused:
        check_config_file(config(tmp_path, f'["{a}", "{missing}"]'), roles=("coordinator",))
    assert [(p.path, p.message) for p in refused.value.problems] == [
        ("coordinator.rules_file[1]", f"cannot read {missing}: No such file or directory")
    ]
    with pytest.raises(PluginError, match=rf"{missing}: cannot read rules file"):
        make_plugin_manager(rules_file=[a, missing], entry_points=False, builtins=False)


def test_a_broken_pack_in_a_directory_is_reported_with_its_file(tmp_path: Path) -> None:
    packs = tmp_path / "packs"
    packs.mkdir()
    pack(packs / "good.toml", "one")
    (packs / "bad.toml").write_text('[[rule]]\nname = "x"\nmatch = { kind = "xid" }\naction = "drain"\n')
    with pytest.raises(ConfigError) as refused:
        check_config_file(config(tmp_path, f'["{packs}"]'), roles=("coordinator",))
    [problem] = refused.value.problems
    assert problem.path == "coordinator.rules_file[0]"
    assert problem.message.startswith(f"{packs / 'bad.toml'}: rule[0] 'x': action")


def test_wrong_types_are_reported_at_the_entry() -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config('[coordinator]\nrules_file = ["a.toml", 1, ""]\n')
    assert [(p.path, p.message) for p in refused.value.problems] == [
        ("coordinator.rules_file[1]", "expected str, got int 1"),
        ("coordinator.rules_file[2]", "must not be empty"),
    ]
