"""The shipped example configs with an operator's edits, and nothing else.

What: :func:`set_key` edits one ``key = value`` line inside one ``[table]`` of a TOML
text (comments and every other line kept; a key that is not there is an error, so an example that
drops a key the guide says to edit fails the test), :func:`add_table` appends a table the example
does not spell out (an option ``ftd check-config --explain`` lists), and :func:`agent_config` /
:func:`coordinator_config` apply the edits docs/operators.md §1 documents ("edit: broker, certs,
node"; paths; the API port) to ``examples/config/*.toml``. Why: the operator-day test must run what an
operator installs, so a shipped example that does not work as documented fails there.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from tests.e2e.daemons import REPO

EXAMPLES = REPO / "examples" / "config"


def _table_span(lines: list[str], table: str) -> tuple[int, int]:
    header = f"[{table}]"
    start = next((i for i, line in enumerate(lines) if line.strip() == header), None)
    if start is None:
        raise KeyError(f"no [{table}] table in the example")
    end = next(
        (i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("[")),
        len(lines),
    )
    return start + 1, end


def _key_line(lines: list[str], table: str, key: str) -> int:
    start, end = _table_span(lines, table)
    pattern = re.compile(rf"^\s*{re.escape(key)}\s*=")
    for i in range(start, end):
        if pattern.match(lines[i]):
            return i
    raise KeyError(f"the example has no {table}.{key} to edit")


def set_key(text: str, table: str, key: str, value: str) -> str:
    """``table.key = value`` (value as TOML), replacing the example's line for that key."""
    lines = text.splitlines()
    lines[_key_line(lines, table, key)] = f"{key} = {value}"
    return "\n".join(lines) + "\n"


def add_table(text: str, table: str, body: str) -> str:
    return f"{text.rstrip()}\n\n[{table}]\n{body.strip()}\n"


def q(value: object) -> str:
    """A TOML string for ``value``."""
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _bus(text: str, port: int, ca: Path, cert: Path, key: Path) -> str:
    text = set_key(text, "bus", "host", q("127.0.0.1"))
    text = set_key(text, "bus", "port", str(port))
    text = set_key(text, "bus", "ca_file", q(ca))
    text = set_key(text, "bus", "cert_file", q(cert))
    # The certificate is the identity on the TLS listener: the example's password lines stay
    # commented out (they are for brokers without client certificates), nothing to drop.
    return set_key(text, "bus", "key_file", q(key))


def agent_config(
    *,
    node: str,
    port: int,
    ca: Path,
    cert: Path,
    key: Path,
    kmsg: Path,
    state_dir: Path,
    socket_path: Path,
    socket_group: str,
    heartbeat_timeout_s: float,
) -> str:
    text = _bus((EXAMPLES / "agent.toml").read_text(), port, ca, cert, key)
    text = set_key(text, "agent", "node", q(node))
    text = set_key(text, "agent", "kmsg_path", q(kmsg))
    text = set_key(text, "agent", "state_dir", q(state_dir))
    text = set_key(text, "agent", "socket_path", q(socket_path))
    text = set_key(text, "agent", "socket_group", q(socket_group))
    text = add_table(text, "agent.heartbeat", f"timeout_s = {heartbeat_timeout_s}")
    tomllib.loads(text)
    return text


def coordinator_config(
    *,
    port: int,
    ca: Path,
    cert: Path,
    key: Path,
    ledger: Path,
    slurm_conf: Path,
    api_port: int,
    save_deadline_s: float,
    stop_deadline_s: float,
    dry_run: bool = False,
    rule_dirs: Path | None = None,
) -> str:
    """``rule_dirs``: where the shipped rules/python was installed (operators.md §1 copies it to
    /etc/ftd/rules/python and names that); None keeps the example's checkout-relative path."""
    text = _bus((EXAMPLES / "coordinator.toml").read_text(), port, ca, cert, key)
    if rule_dirs is not None:
        text = set_key(text, "coordinator", "rule_dirs", f"[{q(rule_dirs)}]")
    text = set_key(text, "coordinator", "ledger_path", q(ledger))
    text = set_key(text, "coordinator", "save_deadline_s", str(save_deadline_s))
    text = set_key(text, "coordinator", "stop_deadline_s", str(stop_deadline_s))
    text = set_key(text, "coordinator.slurm", "slurm_conf", q(slurm_conf))
    text = set_key(text, "coordinator.api", "port", str(api_port))
    text = set_key(text, "coordinator.policy", "dry_run", "true" if dry_run else "false")
    tomllib.loads(text)
    return text
