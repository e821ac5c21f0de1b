"""``ftd demo --help`` reads as plain text: the module docstring's reStructuredText is rendered."""

from __future__ import annotations

import pytest

from ftd.cli import main
from ftd.commands.demo import plain


def test_demo_help_has_no_restructuredtext(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["demo", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "``" not in out and ":func:" not in out and "\n* " not in out
    assert "- xid79 (default)" in out and "--serve" in out and "With --json the last line" in out


def test_plain_drops_literal_quotes_and_roles() -> None:
    text = "See :func:`~ftd.sim.run` and ``--json``:\n* one\n* two"
    assert plain(text) == "See ftd.sim.run and --json:\n- one\n- two"
