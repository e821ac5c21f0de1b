"""Every ``ftd`` command's ``--help`` reads as plain text (issue #32): no reStructuredText quotes or
roles, no Markdown backticks, no issue numbers -- an operator's terminal shows them raw."""

from __future__ import annotations

import argparse
import re

import pytest

from ftd.cli import build_parser

MARKUP = re.compile(r"``|`[^`\n]+`|:(?:mod|func|class|meth|attr|data):|#\d+|\bissue\s+#")


def every_parser() -> list[tuple[str, argparse.ArgumentParser]]:
    """(``ftd a b``, its parser) for the top-level parser and every sub-command, recursively."""
    out: list[tuple[str, argparse.ArgumentParser]] = []
    todo = [("ftd", build_parser())]
    while todo:
        name, parser = todo.pop()
        out.append((name, parser))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, child in action.choices.items():
                    todo.append((f"{name} {sub}", child))
    return sorted(out, key=lambda item: item[0])


PARSERS = every_parser()


def test_the_commands_named_in_the_report_are_covered() -> None:
    names = {name for name, _ in PARSERS}
    assert {"ftd inject", "ftd bench", "ftd run", "ftd status", "ftd rules test"} <= names


@pytest.mark.parametrize(("name", "parser"), PARSERS, ids=[name for name, _ in PARSERS])
def test_help_has_no_markup_and_no_issue_numbers(name: str, parser: argparse.ArgumentParser) -> None:
    text = parser.format_help()
    found = sorted({m.group(0) for m in MARKUP.finditer(text)})
    assert not found, f"{name} --help shows {found}:\n{text}"
