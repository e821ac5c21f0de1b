"""The rank's own flight-recorder dump (issue #33): the client's side (:mod:`ftd.client.flight`) and the
agent's reading of the file a rank names (:func:`ftd.agent.local_api.flight_desk.read_rank_file`):
links, FIFOs, another user's file and oversized dumps are refused with a sentence, never followed."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from ftd.agent.local_api.flight_desk import read_rank_file
from ftd.client import flight

DUMP = json.dumps({"version": "2.10", "entries": [{"collective_seq_id": 1, "state": "scheduled"}]})


def test_the_dump_is_written_to_a_private_file(tmp_path: Path) -> None:
    calls: list[tuple[object, ...]] = []

    def dump(*args: object) -> bytes:
        calls.append(args)
        return DUMP.encode()

    path, error = flight.dump_json(str(tmp_path), dump)
    assert error == "" and path is not None
    assert calls == [(True, False)]  # every collective, not only the active ones
    assert Path(path).read_text() == DUMP
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


@pytest.mark.parametrize(
    ("dump", "why"),
    [
        (lambda *a: (_ for _ in ()).throw(RuntimeError("no process group")), "failed: RuntimeError"),
        (lambda *a: 42, "returned int, not JSON text"),
        (lambda *a: b"x" * (flight.MAX_DUMP_BYTES + 1), "over"),
    ],
)
def test_a_dump_that_cannot_be_given_says_why(tmp_path: Path, dump: object, why: str) -> None:
    path, error = flight.dump_json(str(tmp_path), dump)  # type: ignore[arg-type]
    assert path is None and why in error
    assert list(tmp_path.iterdir()) == []


def test_a_process_without_torch_has_no_dump(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(__import__("sys").modules, "torch", raising=False)
    assert flight.dump_json() == (None, "torch is not imported by this process")


def test_the_agent_reads_the_rank_file_once_and_removes_it(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_text(DUMP)
    assert read_rank_file(str(path), os.getuid()) == (DUMP.encode(), "")
    assert not path.exists()


def test_a_link_a_fifo_another_users_file_and_a_huge_one_are_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("root only")
    link = tmp_path / "link.json"
    link.symlink_to(secret)
    data, why = read_rank_file(str(link), os.getuid())
    assert data is None and "cannot open" in why and secret.exists()
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    assert read_rank_file(str(fifo), os.getuid()) == (None, f"{fifo} is not a regular file")  # no wait
    mine = tmp_path / "mine.json"
    mine.write_text(DUMP)
    data, why = read_rank_file(str(mine), os.getuid() + 1)
    assert data is None and "not the rank's" in why and mine.exists()
    big = tmp_path / "big.json"
    big.write_bytes(b"{" * 100)
    data, why = read_rank_file(str(big), os.getuid(), limit=99)
    assert data is None and "over the limit" in why
    assert read_rank_file("relative.json", None)[1] == "'relative.json' is not an absolute path"
