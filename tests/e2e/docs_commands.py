"""The shell commands of a Markdown document's fenced blocks, as a reader would type them.

What: :func:`commands` reads every fenced block of a document and returns its commands, each with
the document, the line it starts on and, for a console transcript, the output shown under it.

- a block holding lines that start with ``$ `` is a transcript: each such line is a command, the lines
  after it (up to the next ``$ ``) the output the document shows for it;
- a ``sh``/``bash``/``shell`` block is a script: continuation lines (a trailing backslash) are joined,
  comment lines and trailing comments (an unquoted `` #``) are dropped, and every other line is one
  command (``a && b`` stays one);
- any other block (Python, TOML, YAML, a table shown as text) holds no command.

Why here and not in the test: the docs-commands test (:mod:`tests.e2e.test_docs_commands`) and its own
unit test of the extraction share it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SHELL_LANGS = {"sh", "bash", "shell"}
FENCE = re.compile(r"^```([\w+-]*)[^\n]*\n(.*?)^```", re.M | re.S)


@dataclass(frozen=True)
class Command:
    doc: str  # the document, relative to the repository
    line: int  # where the command starts in it (1-based)
    text: str  # the command, continuation lines joined, its comment removed
    output: tuple[str, ...] = ()  # a transcript's lines shown under it

    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def strip_comment(line: str) -> str:
    """``line`` without its trailing comment: an unquoted ``#`` at the start or after a blank."""
    quote = ""
    for index, char in enumerate(line):
        if quote:
            if char == quote:
                quote = ""
            elif char == "\\" and quote == '"':
                continue
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[:index].rstrip()
    return line.rstrip()


def commands(path: Path, repo: Path) -> list[Command]:
    text = path.read_text()
    doc = str(path.relative_to(repo))
    out: list[Command] = []
    for block in FENCE.finditer(text):
        lang, body = block.group(1).lower(), block.group(2)
        first = text.count("\n", 0, block.start(2)) + 1  # the line of the block's first body line
        lines = body.splitlines()
        if any(line.startswith("$ ") for line in lines):
            current: tuple[int, str] | None = None
            shown: list[str] = []
            for offset, line in enumerate(lines):
                if line.startswith("$ "):
                    if current:
                        out.append(Command(doc, current[0], current[1], tuple(shown)))
                    current, shown = (first + offset, line[2:].strip()), []
                elif current and line.strip():
                    shown.append(line)
            if current:
                out.append(Command(doc, current[0], current[1], tuple(shown)))
        elif lang in SHELL_LANGS:
            pending = ""
            start = 0
            for offset, raw in enumerate(lines):
                if not pending:
                    start = first + offset
                    if raw.lstrip().startswith("#"):
                        continue
                if raw.rstrip().endswith("\\"):
                    pending += raw.rstrip()[:-1].rstrip() + " "
                    continue
                command = strip_comment(pending + raw.strip()) if pending else strip_comment(raw.strip())
                pending = ""
                command = re.sub(r"\s+", " ", command).strip()
                if command:
                    out.append(Command(doc, start, command))
    return out


__all__ = ["Command", "commands", "strip_comment"]
