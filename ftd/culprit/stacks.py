"""Rank stacks: py-spy's dumps parsed, merged into one tree over ranks, and read for where ranks wait.

``py-spy dump --pid PID`` (0.4 here) prints either text or, with ``--json``, a JSON list; ``--native``
adds C/C++ frames to either. :func:`parse_py_spy` detects which it was given and reads both:

* text: a ``Process PID: CMD`` and a ``Python vX`` header, then per thread a line
  ``Thread TID (STATUS): "NAME"`` (STATUS is ``idle``, ``active``, ``active+gil``...; the name may be
  absent) and one indented line per frame, innermost first: ``FUNC (FILE:LINE)`` for Python frames,
  ``FUNC (LIBRARY)`` or ``0xADDR (LIBRARY)`` for native ones; ``--locals`` adds deeper-indented
  ``Arguments:``/``Locals:`` blocks, skipped here;
* JSON: one object per thread (``thread_name``, ``os_thread_id``, ``pid``, ``active``, ``frames``),
  in no particular thread order, each frame ``name``/``filename``/``short_filename``/``line``
  (0 for native frames)/``module`` (the library, for native frames).

The main thread is the one named ``MainThread`` or whose OS thread id is the process id; it is put first.
Sizes are bounded (:data:`~ftd.culprit.evidence.MAX_THREADS`, ``MAX_FRAMES`` -- the outermost frames
are cut -- and ``MAX_TEXT`` per string, :data:`MAX_INPUT` for the whole dump) and every cut or
unreadable part is said in the second element of the answer: the parser never raises.

:func:`merge_tree` merges the main threads of many ranks into one prefix tree, root to leaf, the way
LLNL's STAT does: ranks that stand in the same place share a path, and a rank elsewhere branches off.
:func:`render_tree` draws it for an operator (``[7] ranks 0-6`` per node, small branches marked
``<- outlier``). :func:`in_collective` and :func:`place` say whether a thread waits inside a
collective and where it stands; :mod:`ftd.culprit.verdict` builds on them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated

import msgspec

from ftd.culprit.evidence import MAX_FRAMES, MAX_TEXT, MAX_THREADS, Frame, ThreadStack, TreeNode

MAX_INPUT = 8 * 1024 * 1024  # characters of one dump read; the rest is cut (and said)
MAX_ERRORS = 16  # problems reported per dump (the rest counted)

_THREAD = re.compile(r'^Thread\s+(\S+)\s+\(([^)]*)\)(?::\s*"(.*)")?\s*$')
_PROCESS = re.compile(r"^Process\s+(\d+)\s*:")
_FRAME = re.compile(r"^(.*?)\s+\(([^()]*)\)\s*$")
_ADDRESS = re.compile(r"^0x[0-9a-fA-F]+$")

#: Substrings of a frame's function or file (lower case) that place it inside collective communication:
#: torch.distributed's Python layer, the c10d C++ layer and the gloo/NCCL libraries under it.
COLLECTIVE_MARKS = ("torch/distributed", "distributed_c10d", "c10d", "gloo", "nccl")
#: Function names of collectives (Python ``torch.distributed`` names, C++ method names end with them).
COLLECTIVE_FUNCTIONS = frozenset(
    {
        "all_reduce",
        "allreduce",
        "all_gather",
        "allgather",
        "all_gather_into_tensor",
        "all_gather_object",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "all_to_all",
        "all_to_all_single",
        "alltoall",
        "broadcast",
        "broadcast_object_list",
        "barrier",
        "monitored_barrier",
    }
)


class _Problems:
    """Problems met while parsing, bounded: the first :data:`MAX_ERRORS`, then a count."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.more = 0

    def add(self, text: str, *, first: bool = False) -> None:
        if first:  # a summary goes before the details, whatever they crowded out
            self.items.insert(0, _cut(text))
            if len(self.items) > MAX_ERRORS:
                self.items.pop()
                self.more += 1
        elif len(self.items) < MAX_ERRORS:
            self.items.append(_cut(text))
        else:
            self.more += 1

    def result(self) -> list[str]:
        return [*self.items, f"{self.more} more problems not listed"] if self.more else list(self.items)


def _cut(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 3] + "..."


def _is_native(function: str, file: str) -> bool:
    """A C/C++ frame: its "file" is a library (``libc.so.6``) or a C/C++ source, not Python."""
    if _ADDRESS.match(function):
        return True
    base = file.rsplit(":", 1)[0] if file else ""
    if not base or base.startswith("<"):  # "<frozen importlib._bootstrap>", "<string>"
        return False
    return not base.endswith((".py", ".pyx", ".pyi"))


def parse_py_spy(text: str) -> tuple[list[ThreadStack], list[str]]:
    """Parse one ``py-spy dump`` (text or ``--json``, with or without ``--native``): the threads (the
    main thread first) and what was cut or could not be read. Never raises."""
    problems = _Problems()
    try:
        if not isinstance(text, str):
            return [], [f"py-spy dump is {type(text).__name__}, not text"]
        if len(text) > MAX_INPUT:
            problems.add(f"py-spy dump cut at {MAX_INPUT} of {len(text)} characters", first=True)
            text = text[:MAX_INPUT]
        stripped = text.lstrip()
        if not stripped:
            return [], ["py-spy dump is empty"]
        threads = _parse_json(stripped, problems) if stripped[0] in "[{" else _parse_text(text, problems)
        return _bound_threads(threads, problems), problems.result()
    except Exception as exc:  # the promise is "never raises": a bug here must not crash a collection
        return [], [_cut(f"py-spy dump unreadable: {type(exc).__name__}: {exc}")]


def _bound_threads(threads: list[ThreadStack], problems: _Problems) -> list[ThreadStack]:
    threads.sort(key=lambda t: not t.main)  # stable: the main thread first, the others as printed
    if len(threads) > MAX_THREADS:
        problems.add(f"{len(threads)} threads, kept the first {MAX_THREADS}", first=True)
        threads = threads[:MAX_THREADS]
    return threads


class _Thread:
    def __init__(self, tid: str, status: str, name: str, main: bool) -> None:
        self.tid, self.status, self.name, self.main = tid, status, name, main
        self.frames: list[Frame] = []
        self.dropped = 0


def _finish(thread: _Thread, problems: _Problems) -> ThreadStack:
    label = thread.name or thread.tid
    if thread.dropped:
        problems.add(
            f"thread {label}: {len(thread.frames) + thread.dropped} frames, kept the innermost {MAX_FRAMES}"
        )
    idle = None
    if thread.status:
        idle = "idle" in thread.status.lower()
    return ThreadStack(thread=_cut(label), frames=thread.frames, main=thread.main, idle=idle)


def _parse_text(text: str, problems: _Problems) -> list[ThreadStack]:
    pid: str | None = None
    threads: list[ThreadStack] = []
    current: _Thread | None = None
    frame_indent: int | None = None
    unreadable = 0
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip():
            continue
        if not line[0].isspace():
            if current is not None:
                threads.append(_finish(current, problems))
                current = None
            match = _THREAD.match(line)
            if match:
                tid, status, name = match.group(1), match.group(2), match.group(3) or ""
                main = name == "MainThread" or (pid is not None and tid == pid)
                current = _Thread(_cut(tid), status, name, main)
                frame_indent = None
                continue
            process = _PROCESS.match(line)
            if process:
                pid = process.group(1)
            elif not line.startswith(("Python v", "Process ")):
                unreadable += 1
            continue
        if current is None:
            unreadable += 1
            continue
        indent = len(line) - len(line.lstrip())
        if frame_indent is None:
            frame_indent = indent
        if indent > frame_indent:  # --locals: "Arguments:", "Locals:" and their values
            continue
        if len(current.frames) >= MAX_FRAMES:
            current.dropped += 1
            continue
        frame = _text_frame(line.strip())
        if frame is None:
            unreadable += 1
            continue
        current.frames.append(frame)
    if current is not None:
        threads.append(_finish(current, problems))
    if unreadable:
        problems.add(f"{unreadable} lines of the py-spy dump were not understood and skipped")
    if not threads:
        problems.add("no thread found in the py-spy dump")
    return threads


def _text_frame(body: str) -> Frame | None:
    match = _FRAME.match(body)
    if not match:
        return None
    function, where = match.group(1).strip(), match.group(2).strip()
    if not function:
        return None
    file, line = where, None
    head, sep, tail = where.rpartition(":")
    if sep and tail.isdecimal() and len(tail) <= 9:
        file, line = head, int(tail)
    return Frame(function=_cut(function), file=_cut(file), line=line, native=_is_native(function, file))


Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]  # a bigger number is refused


class _JsonFrame(msgspec.Struct):
    name: str = ""
    filename: str = ""
    short_filename: str | None = None
    line: Int64 | None = None
    module: str | None = None


class _JsonThread(msgspec.Struct):
    frames: list[_JsonFrame] = []
    thread_name: str | None = None
    thread_id: Int64 | None = None
    os_thread_id: Int64 | None = None
    pid: Int64 | None = None
    active: bool | None = None


_JSON_DECODER = msgspec.json.Decoder(list[_JsonThread])


def _parse_json(text: str, problems: _Problems) -> list[ThreadStack]:
    try:
        raw = _JSON_DECODER.decode(text)
    except msgspec.DecodeError as exc:  # ValidationError is a DecodeError: wrong types land here too
        problems.add(f"py-spy JSON refused: {exc}")
        return []
    except RecursionError:  # deep nesting in a field skipped (a frame's "locals")
        problems.add("py-spy JSON refused: nested too deeply")
        return []
    threads: list[ThreadStack] = []
    for item in raw:
        tid = item.os_thread_id if item.os_thread_id is not None else item.thread_id
        name = item.thread_name or ""
        main = name == "MainThread" or (tid is not None and item.pid is not None and tid == item.pid)
        thread = _Thread(_cut(str(tid) if tid is not None else "?"), "", name, main)
        for jf in item.frames:
            if len(thread.frames) >= MAX_FRAMES:
                thread.dropped += 1
                continue
            file = jf.short_filename or jf.filename
            native = jf.module is not None or _is_native(jf.name, jf.filename)
            line = jf.line if jf.line is not None and 0 < jf.line < 10**9 else None
            thread.frames.append(
                Frame(function=_cut(jf.name or "?"), file=_cut(file), line=line, native=native)
            )
        stack = _finish(thread, problems)
        if item.active is not None:
            stack = msgspec.structs.replace(stack, idle=not item.active)
        threads.append(stack)
    if not threads:
        problems.add("no thread found in the py-spy dump")
    return threads


# -- reading a stack ------------------------------------------------------------------------------------


def main_thread(threads: Sequence[ThreadStack]) -> ThreadStack | None:
    """The thread a training loop runs in: the one marked main, else the first."""
    for thread in threads:
        if thread.main:
            return thread
    return threads[0] if threads else None


def label(frame: Frame) -> str:
    """A frame as the merged tree names it: function and file, no line (ranks in one function at
    different lines stand in the same place), native addresses without the address (it differs per
    process)."""
    function = "??" if _ADDRESS.match(frame.function) else frame.function
    file = frame.file.rsplit("/", 1)[-1] if frame.native else frame.file
    return f"{function} ({file})" if file else function


def is_collective_frame(frame: Frame) -> bool:
    text = f"{frame.function} {frame.file}".lower()
    if any(mark in text for mark in COLLECTIVE_MARKS):
        return True
    return _function_name(frame) in COLLECTIVE_FUNCTIONS


def in_collective(thread: ThreadStack) -> bool:
    """Whether the thread waits inside collective communication (any of its frames is one)."""
    return any(is_collective_frame(frame) for frame in thread.frames)


def _function_name(frame: Frame) -> str:
    return frame.function.rsplit(".", 1)[-1].rsplit("::", 1)[-1].lower()


def collective(thread: ThreadStack) -> str | None:
    """Which collective the thread is in (``all_reduce (torch/distributed/distributed_c10d.py)``): the
    outermost frame named as a collective (``all_gather_object`` rather than the ``all_gather`` it calls),
    else the outermost frame of the collective layers; None when it is in none. Wrappers such as
    torch's ``_exception_logger`` sit outside every collective alike, so they cannot say which one."""
    for frame in reversed(thread.frames):
        if _function_name(frame) in COLLECTIVE_FUNCTIONS:
            return label(frame)
    for frame in reversed(thread.frames):
        if is_collective_frame(frame):
            return label(frame)
    return None


def place(thread: ThreadStack) -> str:
    """Where the thread stands: its innermost Python frame (native frames below it vary with the
    libc path taken), else its innermost frame; ``<empty>`` for a stack without frames."""
    for frame in thread.frames:
        if not frame.native:
            return label(frame)
    return label(thread.frames[0]) if thread.frames else "<empty>"


# -- the merged tree -----------------------------------------------------------------------------------

ROOT = "all ranks"
NO_STACK = "<no stack>"


class _Build:
    def __init__(self, name: str) -> None:
        self.name = name
        self.ranks: list[int] = []
        self.children: dict[str, _Build] = {}


def merge_tree(stacks: Mapping[int, Sequence[ThreadStack]]) -> TreeNode:
    """Merge every rank's main-thread stack into one tree, root to leaf; each node lists the ranks
    whose stacks pass through it. Ranks without a stack hang off the root as ``<no stack>``. Children
    are ordered by how many ranks they hold, the largest first."""
    root = _Build(ROOT)
    for rank in sorted(stacks):
        root.ranks.append(rank)
        thread = main_thread(stacks[rank])
        path = [label(f) for f in reversed(thread.frames)] if thread is not None and thread.frames else []
        node = root
        for name in path or [NO_STACK]:
            child = node.children.get(name)
            if child is None:
                child = node.children[name] = _Build(name)
            child.ranks.append(rank)
            node = child
    return _freeze_iter(root)


def _freeze_iter(root: _Build) -> TreeNode:
    # iterative post-order: a 256-frame path must not recurse 256 levels deep through freeze()
    order: list[_Build] = []
    todo = [root]
    while todo:
        build = todo.pop()
        order.append(build)
        todo.extend(build.children.values())
    frozen: dict[int, TreeNode] = {}
    for build in reversed(order):
        kids = sorted(build.children.values(), key=lambda b: (-len(b.ranks), min(b.ranks), b.name))
        frozen[id(build)] = TreeNode(
            label=build.name, ranks=sorted(build.ranks), children=[frozen[id(k)] for k in kids]
        )
    return frozen[id(root)]


def rank_ranges(ranks: Iterable[int]) -> str:
    """``0-6,8`` for ranks 0, 1, 2, 3, 4, 5, 6 and 8."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def ranks_text(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {rank_ranges(ranks)}"


def _outlier(child: TreeNode, parent: TreeNode) -> bool:
    """A small branch: fewer ranks than its largest sibling and at most a quarter of its parent's."""
    if len(parent.children) < 2:
        return False
    largest = max(len(c.ranks) for c in parent.children)
    return len(child.ranks) < largest and len(child.ranks) * 4 <= len(parent.ranks)


def render_tree(tree: TreeNode, *, width: int = 100) -> str:
    """The merged tree as text: one line per frame, ``[COUNT] ranks RANGES`` where the set of ranks
    changes, indented only where the tree branches (a straight path stays in one column), small
    branches marked ``<- outlier``; lines cut at ``width``."""
    width = max(width, 20)
    lines: list[str] = []
    # (node, parent, prefix for this line, prefix for its children, shown count)
    todo: list[tuple[TreeNode, TreeNode | None, str, str]] = [(tree, None, "", "")]
    while todo:
        node, parent, prefix, child_prefix = todo.pop()
        text = node.label
        if parent is None or node.ranks != parent.ranks:
            text += f"  [{len(node.ranks)}] {ranks_text(node.ranks)}" if node.ranks else "  [0]"
        if parent is not None and _outlier(node, parent):
            text += "  <- outlier"
        line = prefix + text
        lines.append(line if len(line) <= width else line[: width - 3] + "...")
        kids = node.children
        if len(kids) == 1:
            todo.append((kids[0], node, child_prefix, child_prefix))
            continue
        entries = []
        for index, kid in enumerate(kids):
            last = index == len(kids) - 1
            entries.append(
                (
                    kid,
                    node,
                    child_prefix + ("`- " if last else "|- "),
                    child_prefix + ("   " if last else "|  "),
                )
            )
        todo.extend(reversed(entries))
    return "\n".join(lines)
