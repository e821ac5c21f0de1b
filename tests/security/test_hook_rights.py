"""Who may speak for the Slurm hooks on the agent's socket (issue #12).

``job_start`` / ``job_end`` (what the Prolog and Epilog send) and ``preflight`` are root's (slurmd
runs the hooks as root) or the agent's own uid: an ordinary user's process on the socket, even one
in the socket's group, cannot invent a job on the node, end one, or trigger a preflight. The
``conditions`` question of ``ftd health`` is anyone's who may connect. Real processes of the
unprivileged users of :mod:`tests.security.unprivileged` against a real :class:`LocalApi`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import pytest

from ftd.agent.jobs import HookMsg, JobStartMsg
from ftd.agent.local_api import LocalApi
from ftd.client import protocol
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


@pytest.fixture(scope="module")
def users() -> tuple[User, User, int]:
    return trainer_users()


@pytest.fixture
def rundir() -> Iterator[str]:
    yield from socket_dir("ftd-hook-")


class Hooks:
    def __init__(self) -> None:
        self.seen: list[HookMsg] = []

    async def __call__(self, msg: HookMsg) -> Mapping[str, Any]:
        self.seen.append(msg)
        if isinstance(msg, JobStartMsg):
            return protocol.ok(protocol.JOB_START)
        return {"v": 1, "op": protocol.CONDITIONS, "node": "node-1", "conditions": []}


@pytest.fixture
async def served(rundir: str) -> AsyncIterator[tuple[LocalApi, Hooks]]:
    hooks = Hooks()
    async with served_local_api(rundir, hooks) as api:
        yield api, hooks


async def test_only_root_reports_jobs_and_anyone_in_the_group_asks_conditions(
    served: tuple[LocalApi, Hooks], users: tuple[User, User, int]
) -> None:
    api, hooks = served
    trainer, _, _ = users
    start = json.dumps(protocol.job_start("4242", user="mallory"))
    for msg in (start, json.dumps(protocol.job_end("4242")), json.dumps(protocol.query(protocol.PREFLIGHT))):
        done = await asyncio.to_thread(
            run_as, trainer, SEND_LINE, {"FTD_SOCKET": api.socket_path, "MSG": msg}
        )
        reply = json.loads(done.stdout.strip() or "{}")
        assert reply["op"] == "error" and "only root or the agent's own user" in reply["error"], done
    assert hooks.seen == [] and api.counters["hooks_refused"] == 3

    query = json.dumps(protocol.query(protocol.CONDITIONS))
    done = await asyncio.to_thread(run_as, trainer, SEND_LINE, {"FTD_SOCKET": api.socket_path, "MSG": query})
    assert json.loads(done.stdout)["op"] == protocol.CONDITIONS, done
    assert len(hooks.seen) == 1

    # Root (this test process: slurmd's Prolog runs as root) may report a job.
    reply = await send_as_root(api.socket_path, protocol.job_start("4242", user="alice", gpus=["0", "1"]))
    assert reply == {"v": 1, "op": "ok", "re": "job_start"}
    started = hooks.seen[-1]
    assert isinstance(started, JobStartMsg) and (started.job, started.user, started.gpus) == (
        "4242",
        "alice",
        ["0", "1"],
    )


async def test_a_bad_hook_message_is_an_error_not_a_crash(served: tuple[LocalApi, Hooks]) -> None:
    api, hooks = served
    reply = await send_as_root(api.socket_path, {"v": 1, "op": "job_start", "job": "a/b"})
    assert reply["op"] == "error" and reply["re"] == "job_start"
    bad_end = {"v": 1, "op": "job_end", "job": "1", "leftover": [{"pid": -1}]}
    reply = await send_as_root(api.socket_path, bad_end)
    assert reply["op"] == "error"
    assert hooks.seen == [] and api.counters["bad_messages"] == 2


async def test_random_hook_messages_are_answered_and_harmless(served: tuple[LocalApi, Hooks]) -> None:
    """Every line gets exactly one answer (ok or error), the agent keeps serving: 300 seeded messages
    with the hook ops and fields of wrong types, sizes and shapes."""
    import random

    api, hooks = served
    rng = random.Random(12)
    values: list[Any] = [
        None,
        True,
        -1,
        0,
        2**70,
        1.5,
        "",
        "4242",
        "a/b",
        "x" * 5000,
        [],
        ["0"],
        [1],
        {},
        {"pid": 1},
    ]
    fields = ["job", "user", "uid", "gpus", "tasks", "partition", "leftover", "v"]
    reader, writer = await asyncio.open_unix_connection(api.socket_path)
    try:
        for _ in range(300):
            msg: dict[str, Any] = {"op": rng.choice(["job_start", "job_end", "conditions", "preflight"])}
            for name in rng.sample(fields, rng.randint(0, len(fields))):
                msg[name] = rng.choice(values)
            writer.write(json.dumps(msg).encode() + b"\n")
            await writer.drain()
            reply = json.loads(await asyncio.wait_for(reader.readline(), 5))
            assert reply["op"] in ("ok", "error", "conditions"), reply
    finally:
        writer.close()
    good = await send_as_root(api.socket_path, protocol.job_start("1", user="alice"))
    assert good == {"v": 1, "op": "ok", "re": "job_start"}  # still serving
    assert all(isinstance(m, HookMsg.__args__) for m in hooks.seen)  # type: ignore[attr-defined]
