"""py-spy dumps (real ones, in tests/unit/culprit_dumps/) parsed in every form py-spy 0.4 prints, the
merged tree over ranks and its rendering, and hostile dumps: cut, said, never raised."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as hs

from ftd.culprit.evidence import MAX_FRAMES, MAX_TEXT, MAX_THREADS, Frame, ThreadStack
from ftd.culprit.stacks import (
    collective,
    in_collective,
    merge_tree,
    parse_py_spy,
    place,
    rank_ranges,
    render_tree,
)
from tests.properties import examples

DUMPS = Path(__file__).with_name("culprit_dumps")


def dump(name: str) -> str:
    return (DUMPS / name).read_text()


def parsed(name: str) -> list[ThreadStack]:
    threads, problems = parse_py_spy(dump(name))
    assert problems == [], problems
    return threads


def test_text_dump_of_a_rank_waiting_in_all_reduce() -> None:
    (main,) = parsed("r0.txt")
    assert main.main and main.idle is True and main.thread == "MainThread"
    assert [f.function for f in main.frames] == [
        "all_reduce",
        "_exception_logger.<locals>.wrapper",
        "train_step",
        "<module>",
    ]
    assert main.frames[0] == Frame(
        function="all_reduce", file="torch/distributed/distributed_c10d.py", line=3252, native=False
    )
    assert in_collective(main)
    assert collective(main) == "all_reduce (torch/distributed/distributed_c10d.py)"  # not the wrapper


def test_text_dump_of_a_rank_stuck_before_the_collective() -> None:
    (main,) = parsed("r2.txt")
    assert not in_collective(main)
    assert place(main) == "load_batch (train.py)"


def test_native_text_dump_keeps_native_frames_and_long_cpp_names() -> None:
    (main,) = parsed("r0.native.txt")
    natives = [f for f in main.frames if f.native]
    assert natives[0].function.startswith("0x") and natives[0].file == "libc.so.6"
    assert any(f.function == "c10d::Work::wait" and f.file == "libtorch_cpu.so" for f in natives)
    pybind = [f for f in natives if f.function.startswith("pybind11::cpp_function::initialize")]
    assert pybind and len(pybind[0].function) <= MAX_TEXT and pybind[0].function.endswith("...")
    assert next(f.function for f in main.frames if not f.native) == "all_reduce"
    assert in_collective(main)
    # the innermost Python frame is where the rank stands, not libc's address
    assert place(main) == "all_reduce (torch/distributed/distributed_c10d.py)"


def test_json_dump_is_detected_and_the_main_thread_comes_first() -> None:
    text = dump("fifo.native.json")
    raw = json.loads(text)
    assert raw[0]["thread_name"] != "MainThread"  # py-spy lists the worker first
    threads = parsed("fifo.native.json")
    assert [t.thread for t in threads] == ["MainThread", raw[0]["thread_name"]]
    main = threads[0]
    assert main.main and main.idle is True
    assert main.frames[0].native and main.frames[0].function == "open64"
    assert place(main) == "main_wait (fifo_reader.py)"


def test_text_and_json_of_the_same_rank_agree() -> None:
    (text,) = parsed("r0.txt")
    (js,) = parsed("r0.json")
    assert [(f.function, f.file, f.line) for f in text.frames] == [
        (f.function, f.file, f.line) for f in js.frames
    ]


def test_locals_blocks_are_skipped() -> None:
    text = (
        "Process 7: python x.py\nPython v3.11.7 (/usr/bin/python3.11)\n\n"
        'Thread 7 (active+gil): "MainThread"\n'
        "    step (x.py:3)\n        Arguments:\n            n: 3\n        Locals:\n            y: 4\n"
        "    <module> (x.py:9)\n"
    )
    threads, problems = parse_py_spy(text)
    assert problems == []
    assert [f.function for f in threads[0].frames] == ["step", "<module>"]
    assert threads[0].idle is False


def test_merged_tree_of_three_real_ranks_names_the_outlier() -> None:
    stacks = {0: parsed("r0.txt"), 1: parsed("r1.txt"), 2: parsed("r2.txt")}
    tree = merge_tree(stacks)
    assert tree.ranks == [0, 1, 2]
    (module,) = tree.children
    (step,) = module.children
    assert step.label == "train_step (train.py)"
    assert [(c.label, c.ranks) for c in step.children] == [
        ("_exception_logger.<locals>.wrapper (torch/distributed/c10d_logger.py)", [0, 1]),
        ("load_batch (train.py)", [2]),
    ]
    text = render_tree(tree)
    assert "train_step (train.py)" in text and "[2] ranks 0-1" in text and "[1] rank 2" in text


def test_outliers_are_marked_and_rank_ranges_are_compact() -> None:
    waiting = parsed("r0.txt")
    stacks = {rank: waiting for rank in range(9) if rank != 7}
    stacks[7] = parsed("r2.txt")
    text = render_tree(merge_tree(stacks))
    assert "[8] ranks 0-6,8" in text
    outlier = [line for line in text.splitlines() if "load_batch" in line]
    assert outlier and outlier[0].endswith("<- outlier"), text
    assert all("<- outlier" not in line for line in text.splitlines() if "ranks 0-6,8" in line)
    assert rank_ranges([5, 0, 1, 2, 9, 10, 3]) == "0-3,5,9-10"


def test_a_rank_without_a_stack_is_shown_not_dropped() -> None:
    tree = merge_tree({0: parsed("r0.txt"), 1: []})
    assert [(c.label, c.ranks) for c in tree.children][-1] == ("<no stack>", [1])


def test_render_cuts_lines_at_width() -> None:
    tree = merge_tree({0: parsed("r0.native.txt"), 1: parsed("r2.native.txt")})
    lines = render_tree(tree, width=60).splitlines()
    assert lines and all(len(line) <= 60 for line in lines)


def test_a_hundred_thousand_frames_are_cut_and_the_cut_said() -> None:
    body = "".join(f"    f{i} (deep.py:{i % 1000 + 1})\n" for i in range(100_000))
    text = f'Process 9: python deep.py\n\nThread 9 (idle): "MainThread"\n{body}'
    threads, problems = parse_py_spy(text)
    assert len(threads[0].frames) == MAX_FRAMES
    assert threads[0].frames[0].function == "f0"  # the innermost kept
    assert any("100000 frames" in p and f"{MAX_FRAMES}" in p for p in problems), problems
    tree = merge_tree({0: threads, 1: threads})
    assert "f0 (deep.py)" in render_tree(tree)


def test_json_with_too_many_frames_and_threads_is_cut() -> None:
    frame = {"name": "f", "filename": "/x/a.py", "short_filename": "a.py", "line": 1, "module": None}
    threads = [
        {"thread_name": f"t{i}", "os_thread_id": i + 1, "pid": 1, "frames": [frame] * (MAX_FRAMES + 5)}
        for i in range(MAX_THREADS + 3)
    ]
    out, problems = parse_py_spy(json.dumps(threads))
    assert len(out) == MAX_THREADS and all(len(t.frames) == MAX_FRAMES for t in out)
    assert out[0].main  # os_thread_id == pid
    assert any("threads, kept the first" in p for p in problems)


def test_hostile_json_is_refused_with_a_reason() -> None:
    for text in (
        "[" * 100_000 + "]" * 100_000,
        '[{"frames": [{"name": "f", "locals": ' + "[" * 200_000 + "]" * 200_000 + "}]}]",
        '[{"frames": [{"name": "f", "line": 1.5}]}]',
        '[{"frames": "not a list"}]',
        '{"frames": []}',
        "[1, 2, 3]",
        '[{"frames": [{"name": ',
    ):
        threads, problems = parse_py_spy(text)
        assert threads == []
        assert problems and problems[0].startswith("py-spy JSON refused"), problems


def test_a_huge_number_is_refused() -> None:
    for digits in (20, 400, 5000):
        threads, problems = parse_py_spy('[{"frames": [{"name": "f", "line": ' + "9" * digits + "}]}]")
        assert threads == [] and problems[0].startswith("py-spy JSON refused"), problems


def test_py_spy_errors_and_junk_are_said() -> None:
    threads, problems = parse_py_spy(
        "Error: Failed to find python version from target process\n\nStack backtrace:\n   0: anyhow\n"
    )
    assert threads == []
    assert "no thread found in the py-spy dump" in problems
    assert parse_py_spy("") == ([], ["py-spy dump is empty"])
    assert parse_py_spy(None)[1] == ["py-spy dump is NoneType, not text"]  # type: ignore[arg-type]


frame_lines = hs.one_of(
    hs.text(max_size=80),
    hs.builds(
        lambda f, file, line: f"    {f} ({file}:{line})",
        hs.text(max_size=20),
        hs.text(max_size=20),
        hs.integers(-5, 10**12),
    ),
    hs.builds(
        lambda tid, st, n: f'Thread {tid} ({st}): "{n}"',
        hs.text(max_size=8),
        hs.text(max_size=8),
        hs.text(max_size=8),
    ),
    hs.just("        Locals:"),
)


@settings(max_examples=examples(400))
@given(hs.lists(frame_lines, max_size=40))
def test_arbitrary_text_never_raises_and_stays_bounded(lines: list[str]) -> None:
    threads, problems = parse_py_spy("\n".join(lines))
    assert len(threads) <= MAX_THREADS
    for thread in threads:
        assert len(thread.frames) <= MAX_FRAMES
        assert all(len(f.function) <= MAX_TEXT and len(f.file) <= MAX_TEXT for f in thread.frames)
    assert all(isinstance(p, str) for p in problems)
    render_tree(merge_tree({0: threads, 1: threads[1:]}))


json_values = hs.recursive(
    hs.none() | hs.booleans() | hs.integers() | hs.floats() | hs.text(max_size=10),
    lambda inner: hs.lists(inner, max_size=4) | hs.dictionaries(hs.text(max_size=12), inner, max_size=4),
    max_leaves=30,
)


@settings(max_examples=examples(300))
@given(json_values)
def test_arbitrary_json_never_raises(value: object) -> None:
    threads, problems = parse_py_spy(json.dumps(value))
    assert threads or problems
