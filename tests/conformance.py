"""The peers' conformance corpus (``../shared/conformance/``), read in place, for the conformance tests.

What: the expectation entries of every peer's ``expected.json`` and the multi-line cases of its
``sequences.json`` (schema: ``../shared/conformance/MANIFEST.md``), plus small helpers the tests
share: the peer's expectation values of an entry, its lines, and ftd's kernel-log parse of them.

Why here and not copied: the corpus is other projects' test data, kept outside this repository on
purpose (issue #23: "do not copy the corpus into the project"). The folder sits beside the project
root (or where ``FTD_CONFORMANCE_DIR`` says). When it is absent the conformance tests skip, saying
so -- except under ``FTD_REQUIRE_REAL=1`` (CI), where its absence fails them, as a missing real part
does (tests/realparts.py).
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from ftd.agent.kmsg_parse import KernelEvent, KmsgParser, parse_lines

ROOT = Path(__file__).resolve().parents[1]
# ``FTD_CONFORMANCE_DIR`` names it where a checkout does not sit beside it (a clone made elsewhere).
CORPUS = Path(os.environ.get("FTD_CONFORMANCE_DIR") or ROOT.parent / "shared" / "conformance")
REQUIRE = os.environ.get("FTD_REQUIRE_REAL") == "1"


#: Where ftd deliberately does not meet a peer's expectation, each with its reason (issue #31 item 6).
DIVERGENCES_FILE = ROOT / "tests" / "conformance_divergences.toml"


@dataclass(frozen=True)
class Divergences:
    """:data:`DIVERGENCES_FILE`, read: the only misses the conformance suite accepts."""

    positive: dict[tuple[str, str], str]  # a peer word ftd reports nothing for -> why
    negative: dict[tuple[str, str], tuple[frozenset[str], str]]  # (peer, test) -> ftd's kinds, why
    xid: dict[str, str]  # a check's name in test_conformance_xid.py -> why


@cache
def divergences() -> Divergences:
    raw = tomllib.loads(DIVERGENCES_FILE.read_text(encoding="utf-8"))
    for section in raw.values():
        for item in section:
            assert str(item.get("reason", "")).strip(), (
                f"{DIVERGENCES_FILE.name}: a divergence without a reason: {item}"
            )
    return Divergences(
        positive={(str(d["word"][0]), str(d["word"][1])): d["reason"] for d in raw.get("positive", [])},
        negative={
            (str(d["peer"]), str(d["test"])): (frozenset(d["kinds"]), d["reason"])
            for d in raw.get("negative", [])
        },
        xid={str(d["name"]): d["reason"] for d in raw.get("xid", [])},
    )


@dataclass(frozen=True)
class Entry:
    """One expectation entry: ``peer`` (its folder), ``index`` in that peer's ``expected.json``."""

    peer: str
    index: int
    raw: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.raw["kind"])

    @property
    def match(self) -> bool | None:
        match = self.raw.get("match")
        return match if isinstance(match, bool) else None

    @property
    def code(self) -> int | None:
        code = self.raw.get("xid")
        return code if isinstance(code, int) else None

    @property
    def pci(self) -> str | None:
        pci = self.raw.get("pci_normalized")
        return pci.lower() if isinstance(pci, str) else None

    @property
    def lines(self) -> list[str]:
        """The entry's text as lines (a few entries are a multi-line block joined by newlines)."""
        return str(self.raw["line"]).split("\n")

    @property
    def tests(self) -> list[str]:
        return [str(source.get("test", "")) for source in self.raw.get("sources", [])]

    def expectations(self) -> Iterator[dict[str, Any]]:
        for source in self.raw.get("sources", []):
            expect = source.get("peer_expect")
            if isinstance(expect, dict):
                yield expect

    def where(self) -> str:
        return f"{self.peer}#{self.index} {self.lines[0][:100]!r}"


def require_corpus() -> Path:
    """The corpus folder; skips (fails under ``FTD_REQUIRE_REAL=1``) when it is absent."""
    if not (CORPUS / "MANIFEST.md").is_file():
        msg = f"conformance corpus not found at {CORPUS} (the peers' test data, kept beside the project)"
        if REQUIRE:
            pytest.fail(f"FTD_REQUIRE_REAL=1 and {msg}", pytrace=False)
        pytest.skip(msg)
    return CORPUS


@cache
def _load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def entries() -> list[Entry]:
    """Every expectation entry of every peer, in a stable order."""
    root = require_corpus()
    out: list[Entry] = []
    for path in sorted(root.glob("*/expected.json")):
        for index, raw in enumerate(_load(path)):
            out.append(Entry(path.parent.name, index, raw))
    return out


def sequences(peer: str) -> list[dict[str, Any]]:
    """The multi-line cases of one peer (``[]`` when it has none)."""
    path = require_corpus() / peer / "sequences.json"
    return list(_load(path)) if path.is_file() else []


def sequence_lines(case: dict[str, Any]) -> list[str]:
    """A case's lines (an element may itself hold a block joined by newlines)."""
    return [line for item in case.get("lines", []) for line in str(item).split("\n")]


def _strings_under_lines(node: Any, inside: bool = False) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _strings_under_lines(value, inside or key == "lines")
    elif isinstance(node, list):
        for value in node:
            yield from _strings_under_lines(value, inside)
    elif isinstance(node, str) and inside:
        yield node


@cache
def corpus_lines() -> frozenset[str]:
    """Every log line the corpus holds, stripped: the entries' ``line``, the sequences' ``lines`` and
    every line of the peers' raw data files (their MANIFEST.md and JSON configs are not log lines)."""
    root = require_corpus()
    texts: list[str] = []
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        if path.name == "expected.json":
            texts += [str(raw["line"]) for raw in _load(path)]
        elif path.name == "sequences.json":
            texts += list(_strings_under_lines(_load(path)))
        elif path.suffix not in (".json", ".md"):
            texts.append(path.read_text(encoding="utf-8", errors="replace"))
    return frozenset(line.strip() for text in texts for line in text.splitlines() if line.strip())


def kernel_events(lines: list[str]) -> list[KernelEvent]:
    """ftd's parse of ``lines`` as one kernel log, in order, with a fresh parser."""
    return list(parse_lines(lines, KmsgParser()))
