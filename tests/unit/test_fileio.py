"""ftd.fileio.write_atomic: whole replacement, no temp file left behind, fsync only when asked."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ftd import fileio
from ftd.fileio import write_atomic


def _fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Record (st_dev, st_ino) of every descriptor os.fsync is called on."""
    seen: list[tuple[int, int]] = []
    real = os.fsync

    def record(fd: int) -> None:
        st = os.fstat(fd)
        seen.append((st.st_dev, st.st_ino))
        real(fd)

    monkeypatch.setattr(fileio.os, "fsync", record)
    return seen


def _identity(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def test_replaces_the_content_and_leaves_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    target.write_text("old content, longer than the new one")
    write_atomic(target, b"new", fsync=False)
    assert target.read_bytes() == b"new"
    write_atomic(target, "text é", fsync=False)
    assert target.read_text(encoding="utf-8") == "text é"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_the_old_content_is_replaced_by_rename_not_rewritten_in_place(tmp_path: Path) -> None:
    target = tmp_path / "state"
    target.write_bytes(b"old")
    reader = target.open("rb")  # a reader holding the old file keeps seeing the old content
    write_atomic(target, b"new", fsync=False)
    assert reader.read() == b"old"
    reader.close()
    assert target.read_bytes() == b"new"


def test_an_error_removes_the_temp_file_and_keeps_the_old_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "state"
    target.write_bytes(b"old")

    def fail(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fileio.os, "replace", fail)
    with pytest.raises(OSError, match="No space"):
        write_atomic(target, b"new", fsync=True)
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state"]


def test_a_failed_write_removes_the_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "state"

    def fail(fd: int, data: object) -> int:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(fileio.os, "write", fail)
    with pytest.raises(OSError, match="Input/output"):
        write_atomic(target, b"new", fsync=False)
    assert list(tmp_path.iterdir()) == []


def test_fsync_flushes_the_file_then_its_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _fsyncs(monkeypatch)
    target = tmp_path / "state"
    write_atomic(target, b"durable", fsync=True)
    assert seen == [_identity(target), _identity(tmp_path)]  # the temp file became the target


def test_without_fsync_nothing_is_flushed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _fsyncs(monkeypatch)
    write_atomic(tmp_path / "state", b"x", fsync=False)
    assert seen == []


def test_mode_and_missing_directory(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "private", b"x", fsync=False, mode=0o600)
        write_atomic(tmp_path / "public", b"x", fsync=False, mode=0o644)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "private").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "public").st_mode) == 0o644
    with pytest.raises(FileNotFoundError):
        write_atomic(tmp_path / "missing" / "state", b"x", fsync=False)


def test_imports_nothing_from_ftd() -> None:
    import ast

    tree = ast.parse(Path(fileio.__file__).read_text())
    names = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {n for n in names if n == "ftd" or n.startswith("ftd.")}
