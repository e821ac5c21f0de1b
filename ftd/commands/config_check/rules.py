"""The rules a config names, checked through the coordinator's own loaders.

What: :func:`check_rules` loads every ``coordinator.rule_dirs`` file and ``coordinator.rules_file``
pack the way the coordinator does (one problem per broken file, at the option that names it), then,
when all load, builds the coordinator's plugin manager (duplicate names, unknown hooks) and checks
the rule names ``disabled_rules`` and ``policy.dry_run_rules`` refer to (a typo would leave a rule
enabled, or acting for real), suggesting the closest known name.

Why above the config package: these checks are the coordinator's loaders run early, so this module
imports :mod:`ftd.coordinator.decide` and :mod:`ftd.plugin`; :mod:`ftd.config` stays a ground floor
that imports neither. The loaders are imported inside :func:`check_rules`, so importing the checker
stays light for an agent-only check. Loading rule files runs their module code (rule modules are
pure by contract).
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path

from ftd.commands.config_check.found import Found
from ftd.config import paths
from ftd.config.errors import Problem
from ftd.config.schema import Config

__all__ = ["check_rules"]


def check_rules(config: Config, found: Found) -> None:
    """``rule_dirs`` and ``rules_file`` through the coordinator's loaders, one problem per broken file;
    then, if all load, the plugin manager the coordinator builds (duplicate names, unknown hooks) and
    the rule names the config refers to."""
    from importlib.metadata import entry_points

    from ftd.coordinator.decide.declarative import (
        DeclarativeError,
        DeclarativeRule,
        duplicate_problems,
        load_rules_file,
        pack_files,
        rules_file_entries,
    )
    from ftd.coordinator.decide.plugins import (
        DEFAULT_RULES,
        PluginError,
        default_rule_name,
        load_rule_file,
        make_plugin_manager,
        rule_files,
    )
    from ftd.plugin.hookspecs import PROJECT

    cfg = config.coordinator
    disabled = set(cfg.disabled_rules)
    plugins = {default_rule_name(m) for m in DEFAULT_RULES} | {ep.name for ep in entry_points(group=PROJECT)}
    rule_names = set(plugins)  # what an action request's ``rule`` can be (policy.dry_run_rules)
    loaded = found.known("coordinator.rule_dirs", "coordinator.rules_file", "coordinator.disabled_rules")
    for i, directory in enumerate(cfg.rule_dirs):
        option = f"coordinator.rule_dirs[{i}]"
        if not found.check(option, directory, paths.dir_problem):
            loaded = False
            continue
        for path in rule_files([directory]):
            plugins.add(path.stem)
            rule_names.add(path.stem)
            if path.stem in disabled:
                continue  # never loaded: a broken disabled file does not stop the coordinator
            try:
                load_rule_file(path)
            except PluginError as exc:
                found.problems.append(Problem(option, str(exc)))
                loaded = False
    declared_all: list[DeclarativeRule] = []
    listed = isinstance(cfg.rules_file, list)  # a list's problems are reported at rules_file[i]
    for i, entry in enumerate(rules_file_entries(cfg.rules_file)):
        option = f"coordinator.rules_file[{i}]" if listed else "coordinator.rules_file"
        test = paths.dir_problem if Path(entry).is_dir() else paths.file_problem
        if not found.check(option, str(entry), test):
            loaded = False
            continue
        for pack in pack_files(entry):
            try:
                declared = load_rules_file(pack)
            except DeclarativeError as exc:
                found.problems.extend(Problem(option, f"{exc.source}: {problem}") for problem in exc.problems)
                loaded = False
            else:
                declared_all.extend(declared)
                plugins.update(name for rule in declared for name in (rule.plugin_name, rule.name))
                rule_names.update(rule.name for rule in declared)
    if loaded and (duplicates := duplicate_problems(declared_all)):
        found.problems.extend(Problem("coordinator.rules_file", problem) for problem in duplicates)
        loaded = False
    if not loaded:
        return  # names and hooks are checked once every file loads
    try:
        make_plugin_manager(
            disabled=cfg.disabled_rules,
            rule_dirs=cfg.rule_dirs,
            rules_file=cfg.rules_file,
            entry_points=False,
        )
    except PluginError as exc:
        where = "coordinator.rule_dirs" if cfg.rule_dirs else "coordinator.rules_file"
        found.problems.append(Problem(where, str(exc)))
    for option, names, known in (
        ("coordinator.disabled_rules", cfg.disabled_rules, plugins),
        ("coordinator.policy.dry_run_rules", cfg.policy.dry_run_rules, rule_names),
    ):
        if found.known(option):
            found.problems.extend(_unknown_names(option, names, known))


def _unknown_names(option: str, names: Iterable[str], known: Collection[str]) -> Iterator[Problem]:
    for i, name in enumerate(names):
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f"; known: {', '.join(sorted(known))}"
            yield Problem(f"{option}[{i}]", f"no rule named {name!r}{hint}")
