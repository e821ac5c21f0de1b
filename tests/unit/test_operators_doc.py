"""docs/operators.md stays true: every config option it names exists (``ftd check-config --explain``
lists the same schema), every repository path it names exists, every ``ftd`` sub-command it shows
is one the CLI has, and its TOML rule example loads as a declarative rule."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from ftd.cli import build_parser
from ftd.config import describe_options

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "operators.md").read_text()


def test_every_option_named_exists() -> None:
    paths = {o.path.replace("[]", "") for o in describe_options(nested=True)}
    sections = {p.rsplit(".", i)[0] for p in paths for i in range(1, p.count(".") + 1)}
    named = {
        n
        for n in re.findall(r"`((?:agent|coordinator|bus)\.[a-z_.]+)", DOC)
        if not n.endswith((".yaml", ".toml"))
    }
    named |= {f"coordinator.policy.{k}" for k in re.findall(r"`policy\.([a-z_]+)`", DOC)}
    assert named, "the guide names no option?"
    unknown = sorted(n for n in named if n not in paths and n not in sections)
    assert not unknown, f"docs/operators.md names options that do not exist: {unknown}"


def test_every_repository_path_named_exists() -> None:
    roots = r"(?:deploy|examples|systemd|rules|plugins|scripts|ftd(?!/v1/)|docs)"  # ftd/v1/...: a topic
    named = set(re.findall(rf"`({roots}/[^`\s{{*]+)`", DOC))
    assert len(named) > 10
    missing = sorted(p for p in named if not (REPO / p.rstrip("/")).exists())
    assert not missing, f"docs/operators.md names files that do not exist: {missing}"


def test_every_command_shown_is_one_the_cli_has() -> None:
    commands = set(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    shown = set(re.findall(r"`ftd ([a-z][a-z-]+)", DOC))  # inline code
    for block in re.findall(r"```(?:sh)?\n(.*?)```", DOC, flags=re.S):  # command lines of code blocks
        shown |= set(re.findall(r"^\s*(?:sudo )?ftd ([a-z][a-z-]+)", block, flags=re.M))
    assert {"health", "preflight", "inject", "status", "rules", "check-config"} <= shown
    assert shown <= commands, f"not ftd commands: {sorted(shown - commands)}"


def test_the_toml_rule_example_loads() -> None:
    from ftd.coordinator.decide.declarative import parse_rules

    block = re.search(r"```toml\n(\[\[rule\]\].*?)```", DOC, flags=re.S)
    assert block is not None
    rules = parse_rules(tomllib.loads(block.group(1)), "docs/operators.md")
    assert [r.plugin_name for r in rules] == ["toml:ib-link-flapping"]
