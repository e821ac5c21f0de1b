"""docs/architecture.md says what the code does: hooks, topic tree, layer contracts, parsed from the page.

What: three parts of the design page are read from the page itself and compared with their source of
truth, so an edit to one without the other fails here:

- the hooks of §6 (``ftd_name(arg, ...)`` in the **Hooks** item) against the hookspecs of
  ``ftd/plugin/hookspecs.py``: the same hooks, each with the same arguments in the same order;
- the topic table of §4 against the builders of ``ftd/bus/topics.py`` (each called with ``{arg}``
  placeholders): the same topics, and each one built in ``ftd/`` outside ``topics.py`` or matched by a
  subscription pattern used there (else it is a topic nothing publishes or subscribes to);
- the contracts of §3.3 (``**`id`**`` items) against ``[tool.importlinter]`` of ``pyproject.toml``:
  the same contract ids, and for each layers contract the same layers in the same order.

Why: the page is what a plugin author and a new engineer read first; it had drifted (a hook's
argument named differently, a topic that was never published, a contract said to catch what it did
not), and nothing noticed.
"""

from __future__ import annotations

import ast
import inspect
import re
import tomllib
from pathlib import Path

from ftd.bus import topics
from ftd.plugin import hookspecs

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "architecture.md"


def section(text: str, number: int) -> str:
    """The text of ``## N.`` up to the next ``## ``, or of ``### N.M`` up to the next heading."""
    match = re.search(rf"^(#+) {re.escape(str(number))}\.? .*$", text, re.MULTILINE)
    assert match, f"docs/architecture.md has no section {number}"
    rest = text[match.end() :]
    end = re.search(rf"^#{{1,{len(match.group(1))}}} ", rest, re.MULTILINE)
    return rest[: end.start()] if end else rest


def doc_text() -> str:
    return DOC.read_text()


# --- hooks --------------------------------------------------------------------------------------


def doc_hooks(text: str) -> dict[str, list[str]]:
    """``{hook: [argument, ...]}`` of every ``ftd_name(args)`` in §6's **Hooks** item."""
    body = section(text, 6)
    item = re.search(r"^- \*\*Hooks\*\*.*?(?=^- \*\*|\Z)", body, re.MULTILINE | re.DOTALL)
    assert item, "§6 has no **Hooks** item"
    found: dict[str, list[str]] = {}
    for name, args in re.findall(r"`(ftd_\w+)\(([^)`]*)\)", item.group(0)):
        found[name] = [a.strip() for a in args.split(",") if a.strip()]
    return found


def code_hooks() -> dict[str, list[str]]:
    return {
        name: list(inspect.signature(fn).parameters)
        for name, fn in vars(hookspecs).items()
        if name.startswith("ftd_") and inspect.isfunction(fn) and hasattr(fn, "ftd_spec")
    }


def test_the_doc_names_every_hook_with_the_code_s_arguments() -> None:
    assert doc_hooks(doc_text()) == code_hooks()


def test_the_hook_check_sees_a_renamed_argument() -> None:
    text = doc_text().replace("ftd_evaluate(event, view", "ftd_evaluate(event, cluster", 1)
    assert doc_hooks(text) != code_hooks()


# --- topics -------------------------------------------------------------------------------------


def doc_topics(text: str) -> set[str]:
    """The first column of §4's topic table."""
    return set(re.findall(r"^\| `(ftd/v1/[^`]+)` \|", section(text, 4), re.MULTILINE))


def _builders() -> dict[str, str]:
    """``{builder name: topic}`` for every public function of topics.py that builds one topic (called
    with ``{argument}`` placeholders), and the constant topics."""
    built: dict[str, str] = {}
    for name, value in vars(topics).items():
        if name.startswith("_") or getattr(value, "__module__", None) != topics.__name__:
            continue
        if inspect.isfunction(value):
            params = inspect.signature(value).parameters
            if name in ("check_level", "matches", "parse") or any(
                p.annotation not in ("str", str) for p in params.values()
            ):
                continue
            topic = value(*("{" + p.rstrip("_") + "}" for p in params))
            if isinstance(topic, str):
                built[name] = topic
    for name, value in vars(topics).items():
        constant = name.isupper() and isinstance(value, str) and value.startswith(topics.PREFIX + "/")
        if constant and "+" not in value:
            built[name] = value
    return built


def test_the_doc_s_topic_table_is_the_topics_the_code_builds() -> None:
    assert doc_topics(doc_text()) == set(_builders().values())


def _names_used_outside_topics() -> set[str]:
    used: set[str] = set()
    for path in (REPO / "ftd").rglob("*.py"):
        if path == Path(topics.__file__).resolve():
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Attribute):
                used.add(node.attr)
            elif isinstance(node, ast.Name):
                used.add(node.id)
            elif isinstance(node, ast.ImportFrom) and node.module == "ftd.bus.topics":
                used.update(alias.name for alias in node.names)
    return used


def test_every_topic_is_published_or_subscribed_to_by_ftd() -> None:
    """A topic only ``topics.py`` knows is one nothing publishes or subscribes to: each topic's
    builder is called in ``ftd/`` outside ``topics.py``, or a subscription pattern (``ALL_*``) that
    matches it is (the bridges' state is written by Mosquitto and only subscribed to)."""
    used = _names_used_outside_topics()
    patterns = [
        value
        for name, value in vars(topics).items()
        if name.startswith("ALL_") and isinstance(value, str) and name in used
    ]
    unused = {
        name
        for name, topic in _builders().items()
        if name not in used and not any(topics.matches(p, topic) for p in patterns)
    }
    assert unused == set(), f"topics neither published nor subscribed to in ftd/: {sorted(unused)}"


# --- contracts ----------------------------------------------------------------------------------


def doc_contracts(text: str) -> dict[str, str]:
    """``{contract id: its item's text, whitespace folded}`` of §3.3's ``- **`id`**`` items."""
    body = section(text, 3)
    items = re.findall(r"^- \*\*`([\w-]+)`\*\*(.*?)(?=^- |^### |\Z)", body, re.MULTILINE | re.DOTALL)
    return {cid: " ".join(item.split()) for cid, item in items}


def doc_layers(item: str) -> list[set[str]]:
    """The chain after the item's first colon, up to its first sentence end: ``a`` > ``b`` | ``c``
    as ``[{a}, {b, c}]`` (every backticked name in a segment; parenthesised words are a label)."""
    chain = item.split(":", 1)[1]
    chain = re.split(r"(?<=[`)])\.(?: |$)", chain, maxsplit=1)[0]
    return [set(re.findall(r"`([\w.]+)`", segment)) for segment in chain.split(" > ")]


def pyproject_contracts() -> dict[str, dict[str, object]]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    return {c["id"]: c for c in config["tool"]["importlinter"]["contracts"]}


def code_layers(contract: dict[str, object]) -> list[set[str]]:
    layers = contract["layers"]
    assert isinstance(layers, list)
    return [{name.strip() for name in layer.split("|")} for layer in layers]


def test_the_doc_lists_every_contract() -> None:
    assert set(doc_contracts(doc_text())) == set(pyproject_contracts())


def test_the_doc_s_layers_are_the_contracts_layers() -> None:
    documented = doc_contracts(doc_text())
    for cid, contract in pyproject_contracts().items():
        if contract["type"] == "layers":
            assert doc_layers(documented[cid]) == code_layers(contract), cid


def test_the_layer_check_sees_a_missing_layer() -> None:
    text = doc_text().replace("`decide` > `ledger`", "`decide`", 1)
    contract = pyproject_contracts()["coordinator-stages"]
    assert doc_layers(doc_contracts(text)["coordinator-stages"]) != code_layers(contract)
