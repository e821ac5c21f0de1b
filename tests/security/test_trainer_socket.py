"""Issue #11, trainer socket: ordinary users can reach the agent through a group, and a registration
is accepted only for the job the peer process belongs to.

The agent end is a real :class:`LocalApi` on a real unix socket in this (root) process; the trainers
are real processes running as the unprivileged users of :mod:`tests.security.unprivileged`. Findings
reproduced (each failed before the fix):

- the socket was ``0660 root:root`` with no way to name a group, so an ordinary user's trainer got
  EACCES and ``ftd.client`` said nothing (the job silently unprotected);
- any process that could connect could register as any job and rank, and ack for it.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import structlog

from ftd.agent.local_api import LocalApi
from ftd.events import Directive
from tests.security.unprivileged import GROUP, User, popen_as, run_as, trainer_users
from tests.unit.helpers import Recorder, until

pytestmark = pytest.mark.real

# A raw protocol client: register (job/pid from the environment), optionally ack, print every reply.
RAW = r"""
import json, os, socket, sys, time
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(os.environ["FTD_SOCKET"])
except OSError as exc:
    print(json.dumps({"connect_error": exc.errno})); sys.exit(0)
pid = os.environ.get("CLAIM_PID", "self")
msg = {"v": 1, "op": "register", "job": os.environ["CLAIM_JOB"], "rank": 0,
       "pid": os.getpid() if pid == "self" else (None if pid == "none" else int(pid))}
s.sendall(json.dumps(msg).encode() + b"\n")
f = s.makefile("rb")
print(f.readline().decode().strip(), flush=True)
if os.environ.get("WAIT_DIRECTIVE"):
    print(f.readline().decode().strip(), flush=True)
for line in sys.stdin if os.environ.get("FROM_STDIN") else []:
    s.sendall(line.encode())
if os.environ.get("THEN"):
    s.sendall(os.environ["THEN"].encode() + b"\n")
    s.settimeout(1.0)
    try:
        print(f.readline().decode().strip(), flush=True)
    except OSError:
        print("{}", flush=True)
time.sleep(float(os.environ.get("LINGER", "0")))
"""

# The real trainer client, for a few seconds; prints whether it connected.
CLIENT = r"""
import json, time
from ftd.client import Client
c = Client(retry_interval=0.1)
deadline = time.monotonic() + float(__import__("os").environ.get("FOR_S", "1.5"))
while time.monotonic() < deadline and not c.connected:
    time.sleep(0.05)
connected = c.connected
time.sleep(0.3)
c.close()
print(json.dumps({"connected": connected, "job": c.job}))
"""


@pytest.fixture(scope="module")
def users() -> tuple[User, User, int]:
    return trainer_users()


@pytest.fixture
def rundir() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="ftd-sec-", dir="/tmp")
    os.chmod(path, 0o755)  # like RuntimeDirectoryMode=0755: traversable, the socket decides
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def grouped(rundir: str, users: tuple[User, User, int]) -> AsyncIterator[tuple[LocalApi, Recorder]]:
    rec = Recorder()
    api = LocalApi(
        os.path.join(rundir, "agent.sock"), "node-1", rec.on_presence, rec.on_ack, socket_group=GROUP
    )
    await api.start()
    try:
        yield api, rec
    finally:
        await api.stop()


def _replies(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


async def test_without_a_group_an_ordinary_users_trainer_is_refused_and_told_once(
    rundir: str, users: tuple[User, User, int]
) -> None:
    trainer, _, _ = users
    rec = Recorder()
    api = LocalApi(os.path.join(rundir, "agent.sock"), "node-1", rec.on_presence, rec.on_ack)
    await api.start()
    try:
        done = await asyncio.to_thread(
            run_as, trainer, CLIENT, {"FTD_SOCKET": api.socket_path, "FTD_JOB": "777", "FOR_S": "1.5"}
        )
    finally:
        await api.stop()
    assert json.loads(done.stdout.splitlines()[-1]) == {"connected": False, "job": "777"}, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("ftd client:")]
    # It retried about 15 times in 1.5 s; the user hears it once, with what to do about it.
    assert len(warnings) == 1, done.stderr
    assert "EACCES" in warnings[0] and "agent.socket_group" in warnings[0], warnings
    assert "NOT protected" in warnings[0], warnings


async def test_the_socket_group_lets_its_members_in_and_no_one_else(
    grouped: tuple[LocalApi, Recorder], users: tuple[User, User, int]
) -> None:
    api, rec = grouped
    trainer, other, gid = users
    st = os.stat(api.socket_path)
    assert (st.st_gid, stat.S_IMODE(st.st_mode)) == (gid, 0o660)

    member = await asyncio.to_thread(
        run_as, trainer, CLIENT, {"FTD_SOCKET": api.socket_path, "FTD_JOB": "777", "FOR_S": "5"}
    )
    assert json.loads(member.stdout.splitlines()[-1]) == {"connected": True, "job": "777"}, member.stderr
    assert not [line for line in member.stderr.splitlines() if line.startswith("ftd client:")], member.stderr
    await until(lambda: any(job == "777" and ranks for job, ranks in rec.presence))

    outsider = await asyncio.to_thread(
        run_as, other, RAW, {"FTD_SOCKET": api.socket_path, "CLAIM_JOB": "777"}
    )
    assert _replies(outsider.stdout) == [{"connect_error": 13}], outsider.stderr  # EACCES
    assert api.counters["registrations"] == 1


async def test_a_registration_for_another_job_is_refused_counted_and_logged(
    grouped: tuple[LocalApi, Recorder], users: tuple[User, User, int]
) -> None:
    api, rec = grouped
    trainer, _, _ = users
    env = {
        "FTD_SOCKET": api.socket_path,
        "FTD_JOB": "777",
        "CLAIM_JOB": "888",
        "THEN": '{"v":1,"op":"heartbeat","step":5}',
    }
    with structlog.testing.capture_logs() as logs:
        done = await asyncio.to_thread(run_as, trainer, RAW, env)
    replies = _replies(done.stdout)
    assert replies[0]["op"] == "error" and replies[0]["re"] == "register", replies
    assert "refused" in replies[0]["error"] and "777" in replies[0]["error"] and "888" in replies[0]["error"]
    assert replies[1] == {"v": 1, "op": "error", "re": "heartbeat", "error": "not registered"}, replies
    assert api.counters["registrations_refused"] == 1 and api.counters["registrations"] == 0
    refused = [e for e in logs if e["event"] == "registration_refused"]
    assert len(refused) == 1, logs
    assert (
        refused[0]["job"] == "888" and refused[0]["uid"] == trainer.uid and refused[0]["source"] == "environ"
    )
    assert not rec.presence and "888" not in api.jobs()

    # The same user registering its own job is accepted (positive control).
    ok = await asyncio.to_thread(run_as, trainer, RAW, {**env, "CLAIM_JOB": "777", "THEN": ""})
    assert _replies(ok.stdout)[0] == {"v": 1, "op": "ok", "re": "register"}, ok.stdout
    assert api.counters["registrations"] == 1


async def test_a_claimed_pid_must_be_the_peers_own(
    grouped: tuple[LocalApi, Recorder], users: tuple[User, User, int]
) -> None:
    """A forged pid would point the diagnostics' py-spy at another user's process."""
    api, _ = grouped
    trainer, _, _ = users
    done = await asyncio.to_thread(
        run_as,
        trainer,
        RAW,
        {"FTD_SOCKET": api.socket_path, "FTD_JOB": "777", "CLAIM_JOB": "777", "CLAIM_PID": "1"},
    )
    reply = _replies(done.stdout)[0]
    assert reply["op"] == "error" and "pid" in reply["error"], reply
    assert api.counters["registrations_refused"] == 1


async def test_acks_on_a_connection_are_only_for_its_own_job(
    grouped: tuple[LocalApi, Recorder], users: tuple[User, User, int]
) -> None:
    api, rec = grouped
    trainer, _, _ = users
    # A directive for job 888 (someone else's), then one for the trainer's own job 777.
    proc = popen_as(
        trainer,
        RAW,
        {
            "FTD_SOCKET": api.socket_path,
            "FTD_JOB": "777",
            "CLAIM_JOB": "777",
            "WAIT_DIRECTIVE": "1",
            "FROM_STDIN": "1",
            "LINGER": "0.5",
        },
    )
    await until(lambda: "777" in api.jobs())
    await api.deliver(Directive(id="d-888", ts=time.time(), action="save", job="888", deadline_s=30))
    await api.deliver(Directive(id="d-777", ts=time.time(), action="save", job="777", deadline_s=30))
    forged = json.dumps({"v": 1, "op": "ack", "directive_id": "d-888", "ok": True, "step": 9, "path": "/x"})
    real = json.dumps({"v": 1, "op": "ack", "directive_id": "d-777", "ok": True, "step": 9, "path": "/y"})
    out, _ = await asyncio.to_thread(proc.communicate, forged + "\n" + real + "\n", 30)
    replies = _replies(out)
    assert replies[0]["op"] == "ok" and replies[1]["id"] == "d-777", replies  # d-888 never reached it
    await until(lambda: len(rec.acks) == 1)
    assert [(a.directive_id, a.job, a.path) for a in rec.acks] == [("d-777", "777", "/y")]
    assert api.counters["acks_refused"] == 1
    assert [d.id for d in api.pending()] == ["d-888"]  # still waiting for its own job's ranks


# A raw rank supervisor (ftd run, issue #24): supervise (job from CLAIM_JOB), print the reply.
SUPERVISE = r"""
import json, os, socket
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["FTD_SOCKET"])
info = {"role": "spare", "state": "idle"}
s.sendall(json.dumps({"v": 1, "op": "supervise", "job": os.environ["CLAIM_JOB"], "pid": os.getpid(),
                      "info": info}).encode() + b"\n")
print(s.makefile("rb").readline().decode().strip(), flush=True)
"""


async def test_a_supervisor_for_another_job_is_refused(
    grouped: tuple[LocalApi, Recorder], users: tuple[User, User, int]
) -> None:
    """The supervisor's rights are a rank's: only for the job its process belongs to."""
    api, _ = grouped
    trainer, _, _ = users
    env = {"FTD_SOCKET": api.socket_path, "FTD_JOB": "777", "CLAIM_JOB": "888"}
    done = await asyncio.to_thread(run_as, trainer, SUPERVISE, env)
    reply = _replies(done.stdout)[0]
    assert reply["op"] == "error" and reply["re"] == "supervise", reply
    assert "refused" in reply["error"] and "777" in reply["error"] and "888" in reply["error"]
    assert api.counters["supervisors_refused"] == 1 and api.supervisor("888") is None
    # Its own job: accepted (positive control); it then closes without a goodbye: lost.
    ok = await asyncio.to_thread(run_as, trainer, SUPERVISE, {**env, "CLAIM_JOB": "777"})
    assert _replies(ok.stdout)[0] == {"v": 1, "op": "ok", "re": "supervise", "node": "node-1"}, ok.stdout
    await until(lambda: (info := api.supervisor("777")) is not None and info.state == "lost")
