"""No line of the peers' corpus (``../shared/conformance/``) is copied into tests/ or docs/.

Why: the corpus is other projects' test data, read in place by the conformance suite. Copies in unit
tests or docs hid a lost detector (issue #31: removing the NVMe path detector left the conformance
suite green because copied lines still passed elsewhere), and they are not ours to copy. Unit tests
use the project's own example lines; docs describe the forms, with examples of our own.

What counts as a copy, in any file under tests/ and docs/ (its raw lines; a ``.py`` file's string
literals, adjacent ones joined; a ``.md`` file's table cells and code spans; a JSON file's strings):

- a piece of ours of :data:`MIN_PIECE` characters or more that occurs in a corpus line (a whole line,
  or a long enough part of one, pasted);
- a corpus line of :data:`MIN_PIECE` characters or more inside a piece of ours (a pasted line with a
  prefix of our own added);

when the shared text carries a value a peer chose: a number of two digits or more (a pid, a PCI
address, a timestamp, a count, a source line). Text without one is the driver's or the kernel's
fixed wording ("NVRM: fallen off the bus and is not responding to commands."), which a line of our
own cannot avoid; the values are what make a line the peer's. The recorded replay scenarios
(``.jsonl``) and JSON files are scanned too.
"""

from __future__ import annotations

import ast
import contextlib
import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conformance import ROOT, corpus_lines
from tests.properties import examples

MIN_PIECE = 30
_VALUE = re.compile(r"\d{2,}")
SCANNED = ("tests", "docs")
_SCANNED_SUFFIXES = (".py", ".md", ".json", ".jsonl")
_CODE_SPAN = re.compile(r"`([^`]+)`")


def _json_strings(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for value in node.values():
            yield from _json_strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _json_strings(value)
    elif isinstance(node, str):
        yield from node.splitlines()


def _json_documents(path: Path, text: str) -> Iterator[Any]:
    lines = text.splitlines() if path.suffix == ".jsonl" else [text]
    for line in lines:
        with contextlib.suppress(ValueError):
            yield json.loads(line)


def pieces(path: Path, text: str) -> Iterator[str]:
    """The pieces of text a copy could hide in."""
    if path.suffix in (".json", ".jsonl"):
        for document in _json_documents(path, text):
            yield from _json_strings(document)
    if path.suffix == ".py":
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                yield from node.value.splitlines()
    for line in text.splitlines():
        yield line.strip().lstrip("#").strip().strip(",").strip("\"'")
        if path.suffix == ".md":
            yield from _CODE_SPAN.findall(line)
            yield from (cell.strip() for cell in line.split("|"))


class CopyFinder:
    def __init__(self, lines: frozenset[str]) -> None:
        self.corpus = "\n".join(sorted(lines))
        self.valued = sorted(line for line in lines if len(line) >= MIN_PIECE and _VALUE.search(line))

    def copies(self, path: Path, text: str) -> set[str]:
        found: set[str] = set()
        for piece in set(pieces(path, text)):
            piece = piece.strip()
            if self._pasted(piece) or self._embedded(piece):
                found.add(piece)
        return found

    def _pasted(self, piece: str) -> bool:
        return len(piece) >= MIN_PIECE and _VALUE.search(piece) is not None and piece in self.corpus

    def _embedded(self, piece: str) -> bool:
        return len(piece) >= MIN_PIECE and any(line in piece for line in self.valued)


def scanned_files() -> list[Path]:
    return sorted(
        p for d in SCANNED for p in (ROOT / d).rglob("*") if p.is_file() and p.suffix in _SCANNED_SUFFIXES
    )


def test_no_corpus_line_is_copied_into_tests_or_docs() -> None:
    finder = CopyFinder(corpus_lines())
    copied = {
        str(path.relative_to(ROOT)): sorted(found)
        for path in scanned_files()
        if (found := finder.copies(path, path.read_text(encoding="utf-8", errors="replace")))
    }
    report = "\n".join(f"{path}: {len(found)}\n  " + "\n  ".join(found) for path, found in copied.items())
    assert not copied, (
        f"corpus lines copied (read ../shared/conformance/ in place, write our own lines):\n{report}"
    )


def test_the_finder_sees_a_pasted_line_a_truncated_one_and_one_behind_our_prefix() -> None:
    lines = corpus_lines()
    finder = CopyFinder(lines)
    # the longest corpus line with a value early in it, read at run time: nothing copied here
    line = max((x for x in sorted(lines) if _VALUE.search(x[:MIN_PIECE])), key=len)
    for source in (
        f"CASES = [{line!r}]\n",
        f"CASES = [{line[: MIN_PIECE + 5]!r}]\n",
        f"CASES = [{line[:20]!r}\n    {line[20:]!r}]\n",  # split over two literals
        f"CASES = ['[ 1.000] our prefix ' + {line!r}]\n",
    ):
        assert finder.copies(Path("t.py"), source), source
    assert finder.copies(Path("d.md"), f"| kind | `{line}` | x |\n")
    assert not finder.copies(
        Path("t.py"), "CASES = ['NVRM: Xid (PCI:0000:c7:00): 48, pid=31337, our own line']\n"
    )


_OWN_TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp"), blacklist_characters="\x85"),
    max_size=30,
)


@settings(max_examples=examples(200), deadline=None)
@given(st.data(), _OWN_TEXT, _OWN_TEXT)
def test_a_valued_corpus_line_is_found_whatever_surrounds_it(
    data: st.DataObject, before: str, after: str
) -> None:
    """Any corpus line that carries a value, pasted into a literal with any text of ours around it
    (or into a Markdown code span), is reported."""
    finder = _finder()
    line = data.draw(st.sampled_from(finder.valued))
    assert finder.copies(Path("t.py"), f"LINE = {before + line + after!r}\n")
    assert finder.copies(Path("d.md"), f"- {before}`{line}`{after}\n")


@cache
def _finder() -> CopyFinder:
    return CopyFinder(corpus_lines())
