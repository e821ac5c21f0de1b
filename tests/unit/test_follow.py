"""The shared file follower: lines with offsets, partial lines, truncation, rotation, long lines."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftd.agent.follow import FileFollower, Rotation


def append(path: Path, data: bytes) -> None:
    with path.open("ab") as handle:
        handle.write(data)


@pytest.fixture
def follower(tmp_path: Path) -> Iterator[FileFollower]:
    path = tmp_path / "a.log"
    path.write_bytes(b"")
    f = FileFollower(str(path), chunk=8)
    f.open()
    yield f
    f.close()


def read_all(f: FileFollower) -> list[tuple[bytes, int]]:
    out: list[tuple[bytes, int]] = []
    while (lines := f.read()) is not None:
        out.extend(lines)
    return out


def test_complete_lines_with_end_offsets_across_chunks(follower: FileFollower) -> None:
    path = Path(follower.path)
    assert follower.read() is None
    append(path, b"one\na much longer line\nhalf")
    assert read_all(follower) == [(b"one", 4), (b"a much longer line", 23)]
    assert (follower.offset, follower.position, bytes(follower.partial)) == (23, 27, b"half")
    append(path, b" a line\n")
    assert read_all(follower) == [(b"half a line", 35)]
    assert follower.offset == follower.position == 35


def test_truncation_restarts_at_zero(follower: FileFollower) -> None:
    path = Path(follower.path)
    append(path, b"first line\n")
    read_all(follower)
    assert not follower.check_truncation()
    path.write_bytes(b"new\n")
    assert follower.check_truncation()
    assert read_all(follower) == [(b"new", 4)]


def test_rotation_drains_the_old_file_then_switches(follower: FileFollower) -> None:
    path = Path(follower.path)
    append(path, b"a\n")
    read_all(follower)
    assert follower.check_rotation() is Rotation.SAME
    old_inode = follower.inode
    os.rename(path, path.with_suffix(".1"))
    assert follower.check_rotation() is Rotation.GONE  # not recreated yet: keep the old file
    append(path.with_suffix(".1"), b"late\n")
    path.write_bytes(b"new file\n")
    assert follower.check_rotation() is Rotation.DRAIN
    assert read_all(follower) == [(b"late", 7)]
    assert follower.check_rotation() is Rotation.SWITCHED
    assert follower.inode != old_inode and follower.offset == 0
    assert read_all(follower) == [(b"new file", 9)]


def test_long_lines_are_cut_never_buffered(tmp_path: Path) -> None:
    path = tmp_path / "b.log"
    path.write_bytes(b"x" * 50 + b"\nshort\n" + b"y" * 30 + b"\n" + b"z" * 40)
    f = FileFollower(str(path), chunk=16, max_line=10)
    f.open()
    try:
        lines = read_all(f)
        assert [line for line, _ in lines] == [b"x" * 10, b"short", b"y" * 10]
        assert [end for _, end in lines] == [51, 57, 88]
        assert len(f.partial) == 10 and f.skipping and f.cut_lines == 3
        big = FileFollower(str(path), chunk=1 << 16, max_line=10)  # whole lines in one chunk
        big.open()
        assert read_all(big) == lines and big.cut_lines == 3
        big.close()
    finally:
        f.close()
