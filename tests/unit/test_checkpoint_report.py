"""Every save known (issue #34): Client.report_checkpoint sends the checkpoint op for a manifest the
rank wrote or for a directory (whose manifest it writes now), never raises on a bad path, and names
the pending save directives; the save probe of a checkpoint level says read-only and full."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftd.client import Client, protocol
from ftd.client import manifest as mf
from ftd.client.levels import probe
from ftd.client.saves import manifest_for
from tests.properties import examples


def _client() -> Client:
    return Client(job="j1", rank=3, connect=False)


def _sent(client: Client) -> list[dict[str, object]]:
    return [json.loads(m) for m in client._outbox]


def test_a_directory_gets_a_manifest_of_its_files(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "model.pt").write_bytes(b"m" * 1000)
    (tmp_path / "sub/optim.pt").write_bytes(b"o" * 10)
    (tmp_path / "link.pt").symlink_to(tmp_path / "model.pt")
    client = _client()
    path = client.report_checkpoint(1200, str(tmp_path), save_s=0.5, world_size=8)
    assert path == str(tmp_path / mf.manifest_name(3))
    m, why = mf.verify(path)
    assert why == "" and m is not None
    assert (m.step, m.rank, m.world_size, m.level, m.job) == (1200, 3, 8, "local", "j1")
    assert sorted(f.path for f in m.files) == ["model.pt", "sub/optim.pt"]  # no link, no manifest
    [msg] = _sent(client)
    assert msg == protocol.checkpoint(1200, path, level="local", save_s=0.5, nbytes=1010, directive_id=None)
    # Reporting the manifest itself (the trainer wrote it): same manifest, no rewrite.
    before = os.stat(path).st_mtime_ns
    assert client.report_checkpoint(1200, path, level="local") == path
    assert os.stat(path).st_mtime_ns == before


def test_pending_save_directives_are_named(tmp_path: Path) -> None:
    client = _client()
    client._on_directive({"id": "d1", "action": "save", "job": "j1"}, 0)
    client._on_directive({"id": "d2", "action": "save", "job": "j1"}, 0)
    client.report_checkpoint(5, str(tmp_path))
    assert [m["directive_id"] for m in _sent(client) if m["op"] == "checkpoint"] == ["d1", "d2"]
    # take/answer: should_save turns False at once, the ack comes later with the manifest
    assert client.should_save()
    ids = client.take_pending_saves()
    assert ids == ["d1", "d2"] and not client.should_save()
    client.answer_taken(ids, ok=True, step=5, path="/m.json")
    acks = [m for m in _sent(client) if m["op"] == "ack"]
    assert [(a["directive_id"], a["ok"], a["path"]) for a in acks] == [
        ("d1", True, "/m.json"),
        ("d2", True, "/m.json"),
    ]


@pytest.mark.parametrize(
    "bad",
    ["/nonexistent/ckpt", "", "\x00", "relative/dir", "."],
)
def test_a_bad_path_is_refused_not_raised(bad: str, caplog: pytest.LogCaptureFixture) -> None:
    client = _client()
    assert client.report_checkpoint(1, bad) is None
    assert _sent(client) == []


def test_hostile_manifest_and_arguments(tmp_path: Path) -> None:
    hostile = tmp_path / "rank-00003.manifest.json"
    hostile.write_text(json.dumps({"format": mf.FORMAT, "files": [{"path": "../../etc/passwd"}]}))
    assert _client().report_checkpoint(1, str(hostile)) is None
    with pytest.raises(mf.ManifestError, match="level"):
        manifest_for(str(tmp_path), step=1, job="j", rank=0, world_size=1, level="tape")
    with pytest.raises(mf.ManifestError, match="step"):
        manifest_for(str(tmp_path), step=-1, job="j", rank=0, world_size=1)
    with pytest.raises(mf.ManifestError, match="leaves"):
        manifest_for(str(tmp_path), step=1, job="j", rank=0, world_size=1, files=["../x"])


@settings(max_examples=examples(100))
@given(st.text(max_size=40))
def test_any_path_reports_or_refuses(path: str) -> None:
    client = _client()
    result = client.report_checkpoint(1, path)
    assert result is None or os.path.isabs(result)


def test_partners_op_is_kept() -> None:
    client = _client()
    assert client.partners is None
    client._on_line(protocol.encode(protocol.partners("j1", {"n1": "n2", "n2": "n1"})), 0)
    assert client.partners == {"n1": "n2", "n2": "n1"}
    client._on_line(protocol.encode(protocol.partners("other", {"n1": "n9"})), 0)
    assert client.partners == {"n1": "n2", "n2": "n1"}
    assert client.partners_choice == (0, {"n1": "n2", "n2": "n1"})  # no version: 0, the lowest
    client._on_line(protocol.encode(protocol.partners("j1", {"n1": "n3"}, 1, 17)), 0)
    assert client.partners_choice == (17, {"n1": "n3"}) and client.partners == {"n1": "n3"}


def test_probe_says_full_and_not_responding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert probe(str(tmp_path / "new")) == ""
    assert "full" in probe(str(tmp_path), need=1 << 62)
    release = threading.Event()
    real = os.statvfs

    def hung(path: str) -> os.statvfs_result:  # a hard NFS mount whose server is gone
        release.wait(60)
        return real(path)

    monkeypatch.setattr(os, "statvfs", hung)
    try:
        assert "not responding" in probe(str(tmp_path), timeout_s=0.05)
        # while that statvfs is still stuck, the directory is not probed again (no thread pile-up)
        assert "not responding" in probe(str(tmp_path), timeout_s=5.0)
    finally:
        release.set()


def test_partner_ranks() -> None:
    pytest.importorskip("torch")
    from ftd.client.checkpoint import partner_ranks

    assert partner_ranks(["a"], {}) == [None]
    assert partner_ranks(["a", "a", "a"], {}) == [1, 2, 0]
    hosts = ["a", "a", "b", "b", "c", "c"]
    assert partner_ranks(hosts, {}) == [2, 3, 4, 5, 0, 1]
    assert partner_ranks(hosts, {"a": "c", "c": "b", "b": "a"}) == [4, 5, 0, 1, 2, 3]
    assert partner_ranks(hosts, {"a": "a", "b": "gone"}) == [2, 3, 4, 5, 0, 1]  # never itself
