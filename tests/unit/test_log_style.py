"""One logging style in the daemons: ``ftd.logs.get_logger``, snake_case event names, key-value fields.

Every log line of the agent and the coordinator is a JSON object in the journal; operators grep and
alert on the event name, so it must be a fixed identifier (``action_decided``), with the variable
parts as fields, never prose or an f-string. The trainer client (``ftd/client``) is exempt: it runs
inside the user's training process, imports the standard library only and logs through stdlib
``logging`` like the code around it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "ftd"
LEVELS = {"debug", "info", "warning", "error", "exception", "critical"}
SNAKE = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")


def _daemon_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "client" not in p.relative_to(PACKAGE).parts)


def _problems(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    where = path.relative_to(PACKAGE.parent) if path.is_relative_to(PACKAGE.parent) else path
    found: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        func = node.func
        if func.attr in {"get_logger", "getLogger"} and isinstance(func.value, ast.Name):
            # A logger for our own module (``__name__``) comes from ftd.logs; tuning a library's
            # stdlib logger (``logging.getLogger("amqtt").setLevel``) is fine.
            own = func.value.id == "structlog" or (
                bool(node.args) and isinstance(node.args[0], ast.Name) and node.args[0].id == "__name__"
            )
            if own and func.value.id in {"structlog", "logging"} and str(where) != "ftd/logs.py":
                found.append(f"{where}:{node.lineno}: use ftd.logs.get_logger, not {func.value.id}")
            continue
        if func.attr not in LEVELS or not isinstance(func.value, ast.Name) or func.value.id != "log":
            continue
        if not node.args:
            found.append(f"{where}:{node.lineno}: log call without an event name")
            continue
        first = node.args[0]
        if isinstance(first, ast.JoinedStr):
            found.append(f"{where}:{node.lineno}: f-string event name (put the values in fields)")
        elif not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
            found.append(f"{where}:{node.lineno}: event name is not a string literal")
        elif not SNAKE.match(first.value):
            found.append(f"{where}:{node.lineno}: event name {first.value!r} is not snake_case")
    return found


def test_daemon_log_events_are_snake_case_literals_with_fields() -> None:
    problems = [p for path in _daemon_files() for p in _problems(path)]
    assert not problems, "\n".join(problems)


def test_the_checker_catches_each_kind_of_problem(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import structlog\n"
        "log = structlog.get_logger(__name__)\n"
        "log.info('agent started', node=1)\n"
        "log.warning(f'bad {1}')\n"
        "log.error(name)\n"
        "log.info('fine_event', node=1)\n"
    )
    kinds = [p.split(": ", 1)[1].split(" ")[0] for p in _problems(sample)]
    assert len(kinds) == 4 and kinds[0] == "use"
