"""The agent's hang evidence (issue #33): real processes, real py-spy, real /proc; RAS over a local socket."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from ftd.agent.hang_evidence import (
    collect_hang_evidence,
    evidence_ack,
    process_state,
    ras_status,
    read_environ,
)
from ftd.culprit.evidence import Frame, NodeEvidence, RankEvidence, ThreadStack
from ftd.events import MAX_PAYLOAD_BYTES, Ack, Directive, RankInfo, decode, encode
from tests.unit.test_culprit_ras import STATUS as RAS_STATUS

DUMPS = Path(__file__).parent / "culprit_dumps"
_SLEEPER = "import time\ndef wait_here():\n    time.sleep(600)\nwait_here()\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def sleepers(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    debug = tmp_path / "nccl-%h-%p.log"
    env = {
        **os.environ,
        "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "fr_rank_"),
        "TORCH_FR_BUFFER_SIZE": "2000",
        "NCCL_DEBUG_FILE": str(debug),
    }
    procs = [subprocess.Popen([sys.executable, "-c", _SLEEPER], env=env) for _ in range(2)]
    for p in procs:  # wait until each is inside wait_here (its state is sleeping)
        end = time.monotonic() + 60
        while process_state(p.pid) != "sleeping" and time.monotonic() < end:
            time.sleep(0.05)
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def _directive(deadline: float = 15.0) -> Directive:
    return Directive(
        id="act-1-hang-node-a",
        ts=time.time(),
        action="collect_hang_evidence",
        job="42",
        node="node-a",
        deadline_s=deadline,
        action_id="act-1",
        params={"job": "42"},
    )


def test_every_rank_collected_stopped_one_named(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    good, stopped = sleepers
    (tmp_path / "fr_rank_1").write_bytes((DUMPS / "flight_gloo_r1_behind.json").read_bytes())
    # NCCL names it after the host (up to the first dot), not after ftd's node name (H200 device check)
    host = socket.gethostname().split(".")[0]
    (tmp_path / f"nccl-{host}-{good.pid}.log").write_text("NCCL INFO comm 0x1 rank 0 nranks 2\n")
    os.kill(stopped.pid, signal.SIGSTOP)
    try:
        now = time.time()
        ranks = [
            RankInfo(rank=0, pid=good.pid, step=7, last_beat=now - 2.0),
            RankInfo(rank=1, pid=stopped.pid, step=6, last_beat=now - 30.0),
            RankInfo(rank=2, pid=None),
        ]
        ras_port = _free_port()  # nothing listens: recorded, not an error
        evidence = asyncio.run(
            collect_hang_evidence(
                _directive(), ranks, tmp_path / "diag", node="node-a", ras_port=ras_port, clock=lambda: now
            )
        )
    finally:
        os.kill(stopped.pid, signal.SIGCONT)
    by_rank = {r.rank: r for r in evidence.ranks}
    assert by_rank[0].state == "sleeping" and by_rank[1].state == "stopped"
    assert not by_rank[2].answered and "pid" in by_rank[2].errors
    assert by_rank[0].last_step == 7 and by_rank[1].beat_age_s == 30.0
    for rank in (0, 1):  # py-spy read both, the stopped one without suspending it
        functions = [f.function for t in by_rank[rank].stacks for f in t.frames]
        assert "wait_here" in functions, (rank, by_rank[rank].errors)
    assert any(".nonblocking." in f for f in by_rank[1].files)
    assert by_rank[1].flight is not None and by_rank[1].flight.entries  # the JSON dump, parsed
    assert "flight_recorder" in by_rank[0].errors  # configured, no dump for rank 0: said
    assert any(f.endswith(".nccl-debug.txt") for f in by_rank[0].files)
    assert evidence.ras is not None and not evidence.ras.answered and evidence.ras.error
    for r in (by_rank[0], by_rank[1]):
        for name in r.files:
            assert (Path(evidence.path) / name).is_file()
    ack = evidence_ack(_directive(), "node-a", evidence)
    back = decode(encode(ack), Ack)  # within the bus's limits, and it decodes as NodeEvidence again
    assert msgspec.convert(back.data["evidence"], NodeEvidence) == evidence


def test_pickled_flight_dump_refused_never_unpickled(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    import pickle

    marker = tmp_path / "unpickled"

    class Boom:  # unpickling this would create ``marker``
        def __reduce__(self) -> tuple[object, tuple[str, str]]:
            return (open, (str(marker), "w"))

    (tmp_path / "fr_rank_0").write_bytes(pickle.dumps({"version": "2.10", "entries": [Boom()]}))
    evidence = asyncio.run(
        collect_hang_evidence(
            _directive(),
            [RankInfo(rank=0, pid=sleepers[0].pid)],
            tmp_path / "diag",
            node="node-a",
            ras_port=_free_port(),
        )
    )
    rank = evidence.ranks[0]
    assert rank.flight is None and "flight_recorder" in rank.errors
    assert not marker.exists()


def test_gone_process_and_proc_parsing(tmp_path: Path) -> None:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert process_state(p.pid) == "gone"
    assert process_state(os.getpid()) in ("running", "sleeping")
    assert read_environ(p.pid) == {}
    assert read_environ(os.getpid()).get("PATH") == os.environ.get("PATH")
    fake = tmp_path / "proc" / "7"
    fake.mkdir(parents=True)
    (fake / "stat").write_text("7 (odd ) name) T 1 2 3\n")  # comm with spaces and a parenthesis
    assert process_state(7, tmp_path / "proc") == "stopped"
    (fake / "stat").write_text("garbage")
    assert process_state(7, tmp_path / "proc") == "unknown"


def _ras_server(port_holder: list[int], replies: dict[bytes, bytes], stop: threading.Event) -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(10)
    port_holder.append(srv.getsockname()[1])
    conn, _ = srv.accept()
    with conn, srv:
        f = conn.makefile("rb")
        while not stop.is_set():
            line = f.readline()
            if not line:
                return
            word = line.split()[0]
            conn.sendall(replies.get(word, b"ERROR\n"))
            if word == b"STATUS":
                return


def test_ras_answers_and_the_protocol_is_followed() -> None:
    port: list[int] = []
    stop = threading.Event()
    replies = {b"CLIENT": b"SERVER PROTOCOL 2\n", b"TIMEOUT": b"OK\n", b"STATUS": b"Job summary\n2 ranks\n"}
    t = threading.Thread(target=_ras_server, args=(port, replies, stop), daemon=True)
    t.start()
    while not port:
        time.sleep(0.01)
    status = asyncio.run(ras_status("127.0.0.1", port[0], 5.0))
    stop.set()
    assert status.answered and "2 ranks" in status.text


def test_ras_garbage_greeting_is_recorded() -> None:
    port: list[int] = []
    stop = threading.Event()
    t = threading.Thread(target=_ras_server, args=(port, {b"CLIENT": b"HTTP/1.1 400\n"}, stop), daemon=True)
    t.start()
    while not port:
        time.sleep(0.01)
    status = asyncio.run(ras_status("127.0.0.1", port[0], 5.0))
    stop.set()
    assert not status.answered and "unexpected greeting" in status.error


def test_too_big_evidence_is_cut_to_fit_and_says_so() -> None:
    frames = [Frame(function=f"f{i}" * 20, file="/x/" * 50, line=i) for i in range(256)]
    threads = [ThreadStack(thread=str(t), frames=frames, main=t == 0) for t in range(64)]
    ranks = [RankEvidence(rank=r, node="n", pid=r + 10, stacks=threads) for r in range(8)]
    evidence = NodeEvidence(node="n", job="j", ranks=ranks, path="/var/lib/ftd/diagnostics/a")
    ack = evidence_ack(_directive(), "n", evidence)
    payload = encode(ack)
    assert len(payload) <= MAX_PAYLOAD_BYTES
    back = msgspec.convert(decode(payload, Ack).data["evidence"], NodeEvidence)
    assert "size" in back.errors and "/var/lib/ftd/diagnostics/a" in back.errors["size"]
    assert all(len(r.stacks) <= 1 for r in back.ranks) and all(r.stacks for r in back.ranks)


def test_ras_missing_processes_are_read_from_the_whole_answer_and_it_is_kept(tmp_path: Path) -> None:
    """The evidence keeps the first MAX_TEXT characters of RAS's answer, but the processes its Errors
    section names are read from all of it, and the whole answer is saved beside the other raw files."""
    padded = ("Job summary\n" + "  filler line of the summary\n" * 40 + RAS_STATUS).encode()
    assert len(padded) > 1024  # the Errors section lies past what the evidence keeps
    port: list[int] = []
    stop = threading.Event()
    replies = {b"CLIENT": b"SERVER PROTOCOL 2\n", b"TIMEOUT": b"OK\n", b"STATUS": padded}
    threading.Thread(target=_ras_server, args=(port, replies, stop), daemon=True).start()
    while not port:
        time.sleep(0.01)
    status = asyncio.run(ras_status("127.0.0.1", port[0], 5.0, tmp_path))
    stop.set()
    assert status.answered and "Errors" not in status.text
    assert [(p.pid, p.host) for p in status.missing] == [(7302, "10.9.0.4"), (8811, "gpu-b.cluster.example")]
    assert (tmp_path / "ras-status.txt").read_bytes() == padded
