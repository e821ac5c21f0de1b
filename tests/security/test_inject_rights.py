"""Who may inject a drill event through the agent's socket (issue #20, item 3).

``ftd inject`` hands its event to the agent (the ``inject`` op, :mod:`ftd.agent.local_api.inject`)
instead of logging in to the broker as the node. A fault a trainer could fake would let any user on
the node have its jobs stopped or the node drained, so ``inject`` is root's or the agent's own uid,
like the Prolog's hooks: a real unprivileged process in the socket's group is refused (counted, never
handed on), root's event is handed to the agent with ``source = "inject"``. A malformed one (unknown
kind) is the protocol's ``error`` answer.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import pytest

from ftd.agent.local_api import LocalApi
from ftd.agent.local_api.inject import InjectMsg, injected_event, reply
from ftd.events import Kind, Severity
from tests.security.unprivileged import (
    SEND_LINE,
    User,
    run_as,
    send_as_root,
    served_local_api,
    socket_dir,
    trainer_users,
)

pytestmark = pytest.mark.real


XID13 = {"v": 1, "op": "inject", "kind": "xid", "severity": "error", "data": {"code": 13}}


@pytest.fixture(scope="module")
def users() -> tuple[User, User, int]:
    return trainer_users()


@pytest.fixture
def rundir() -> Iterator[str]:
    yield from socket_dir("ftd-inject-")


class Agent:
    """What the agent does with an inject (app.py): the event, and its id as the answer."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    async def __call__(self, msg: Any) -> Mapping[str, Any]:
        assert isinstance(msg, InjectMsg)
        event = injected_event("node-1", msg)
        self.events.append(event)
        return reply(event)


@pytest.fixture
async def served(rundir: str) -> AsyncIterator[tuple[LocalApi, Agent]]:
    agent = Agent()
    async with served_local_api(rundir, agent) as api:
        yield api, agent


async def test_only_root_or_the_agents_user_may_inject(
    served: tuple[LocalApi, Agent], users: tuple[User, User, int]
) -> None:
    api, agent = served
    trainer, _, _ = users
    done = await asyncio.to_thread(
        run_as, trainer, SEND_LINE, {"FTD_SOCKET": api.socket_path, "MSG": json.dumps(XID13)}
    )
    answer = json.loads(done.stdout.strip() or "{}")
    assert answer["op"] == "error" and answer["re"] == "inject", done
    assert "only root or the agent's own user" in answer["error"]
    assert agent.events == [] and api.counters["hooks_refused"] == 1

    answer = await send_as_root(api.socket_path, XID13)
    assert answer["op"] == "inject" and answer["node"] == "node-1" and answer["kind"] == "xid", answer
    assert len(agent.events) == 1
    event = agent.events[0]
    assert (event.id, event.kind, event.severity, event.source) == (
        answer["id"],
        Kind.XID,
        Severity.ERROR,  # the severity the message named
        "inject",
    )
    # read from the kernel line a real Xid 13 prints, and marked as a drill (issue #32)
    assert (event.data["code"], event.data["action"], event.data["drill"]) == (13, "RESTART_APP", True)


async def test_a_malformed_inject_is_an_error_answer(served: tuple[LocalApi, Agent]) -> None:
    api, agent = served
    answer = await send_as_root(api.socket_path, {**XID13, "kind": "no-such-kind"})
    assert answer["op"] == "error" and answer["re"] == "inject", answer
    answer = await send_as_root(api.socket_path, {**XID13, "data": [1, 2]})
    assert answer["op"] == "error" and answer["re"] == "inject", answer
    assert agent.events == [] and api.counters["bad_messages"] == 2
