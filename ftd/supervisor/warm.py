"""A pre-started interpreter with the training imports loaded, waiting for its script (``--warm``).

What: run as ``python -m ftd.supervisor.warm --import torch,numpy [--ready-fd N]`` it imports the
modules, writes ``ready`` on fd N, then blocks reading one JSON line ``{"argv": [...], "env": {...},
"cwd": "..."}`` from stdin, takes that environment (plus ``FTD_WARM_READY_AT``, when its imports
were done) and runs ``argv[1]`` as ``__main__`` with :mod:`runpy` (``argv`` is the training command
``python script.py args...``). :class:`WarmPool` is the supervisor's side: it keeps ``size`` such
interpreters started for the next generation and hands them their rank's environment. Why: a new
generation's ranks then skip the interpreter start and the framework imports (seconds for torch),
the largest part of a restart on a spare after the rendezvous. Only for a command of the form
``python script.py ...`` (:func:`warm_script`).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import runpy
import select
import subprocess
import sys
import time

from ftd.supervisor import output

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

__all__ = ["WarmPool", "main", "warm_script"]

_log = logging.getLogger("ftd.supervisor")
READY_AT_ENV = "FTD_WARM_READY_AT"


def warm_script(command: Sequence[str]) -> str | None:
    """The script of a ``python script.py ...`` command (None: not that form, no warm start)."""
    if len(command) < 2:
        return None
    exe = os.path.basename(command[0])
    if not exe.startswith("python") or command[1].startswith("-") or not command[1].endswith(".py"):
        return None
    return command[1]


class WarmPool:
    """Pre-started interpreters (``size`` of them) of ``python`` with ``modules`` imported."""

    def __init__(
        self,
        python: str,
        modules: Sequence[str],
        env: Mapping[str, str],
        size: int,
        *,
        node: Callable[[], str] | None = None,
    ) -> None:
        """``node``: the node's name now, to prefix every line the interpreters print with (``ftd
        run``'s output prefix, :mod:`ftd.supervisor.output`); None: they write to this process's own
        streams."""
        self.python, self.modules, self.env, self.size = python, list(modules), dict(env), size
        self.node = node
        self._procs: list[tuple[subprocess.Popen[bytes], int]] = []  # (process, read end of ready fd)
        self._ready: set[int] = set()  # pids that said ready
        self._prefixes: dict[int, output.Prefix] = {}  # pid -> its lines' prefix, while pumped

    def fill(self) -> None:
        """Start interpreters until ``size`` are alive."""
        self._procs = [(p, fd) for p, fd in self._procs if p.poll() is None or _close(fd)]
        while len(self._procs) < self.size:
            r, w = os.pipe()
            try:
                proc = subprocess.Popen(
                    [
                        self.python,
                        *("-m", "ftd.supervisor.warm", "--import", ",".join(self.modules)),
                        *("--ready-fd", str(w)),
                    ],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE if self.node is not None else None,
                    stderr=subprocess.PIPE if self.node is not None else None,
                    env=self.env,
                    pass_fds=(w,),
                    start_new_session=True,
                )
            except OSError as exc:
                _close(r)
                _log.error("ftd run: cannot start a warm interpreter (%s): ranks will start cold", exc)
                return
            finally:
                os.close(w)
            self._procs.append((proc, r))
            if self.node is not None and proc.stdout is not None and proc.stderr is not None:
                prefix = self._prefixes[proc.pid] = output.Prefix(output.warm_label(self.node()))
                output.pump(prefix, proc.stdout)
                output.pump(prefix, proc.stderr, sys.stderr.buffer)
            _log.info(
                "ftd run: warm interpreter pid %d started, importing %s", proc.pid, ",".join(self.modules)
            )

    def ready(self) -> bool:
        """True when ``size`` interpreters are alive with their imports done."""
        for proc, fd in self._procs:
            if proc.pid in self._ready or proc.poll() is not None:
                continue
            readable, _, _ = select.select([fd], [], [], 0)
            if readable and os.read(fd, 64).startswith(b"ready"):
                self._ready.add(proc.pid)
        alive = [p for p, _ in self._procs if p.poll() is None and p.pid in self._ready]
        return len(alive) >= self.size

    def take(self, n: int) -> list[subprocess.Popen[bytes]] | None:
        """``n`` live interpreters (ready or still importing), or None when there are not that many."""
        self.ready()
        live = [(p, fd) for p, fd in self._procs if p.poll() is None]
        if len(live) < n:
            return None
        taken, self._procs = live[:n], live[n:]
        for _, fd in taken:
            _close(fd)
        return [p for p, _ in taken]

    def name(self, proc: subprocess.Popen[bytes], prefix: bytes) -> None:
        """From now on, ``proc``'s lines start with ``prefix`` (its rank's label), when pumped."""
        pumped = self._prefixes.pop(proc.pid, None)
        if pumped is not None:
            pumped.value = prefix

    def close(self) -> None:
        for proc, fd in self._procs:
            _close(fd)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, 9)
            with contextlib.suppress(Exception):
                proc.wait(timeout=5.0)
        self._procs = []


def give(proc: subprocess.Popen[bytes], argv: Sequence[str], env: Mapping[str, str], cwd: str) -> bool:
    """Hand a warm interpreter its rank: the command, the environment, the directory."""
    line = json.dumps({"argv": list(argv), "env": dict(env), "cwd": cwd}).encode() + b"\n"
    stdin = proc.stdin
    if stdin is None:
        return False
    try:
        stdin.write(line)
        stdin.close()
    except OSError:
        return False
    return True


def _close(fd: int) -> bool:
    with contextlib.suppress(OSError):
        os.close(fd)
    return False


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ftd.supervisor.warm")
    parser.add_argument("--import", dest="modules", default="", help="comma list of modules to import")
    parser.add_argument("--ready-fd", type=int, default=None, help="write 'ready' here once imported")
    args = parser.parse_args(argv)
    for name in [m.strip() for m in args.modules.split(",") if m.strip()]:
        try:
            importlib.import_module(name)
        except Exception as exc:  # the script will import it again and fail where the user sees it
            sys.stderr.write(f"ftd run: warm interpreter could not import {name}: {exc}\n")
    ready_at = time.time()
    if args.ready_fd is not None:
        with contextlib.suppress(OSError):
            os.write(args.ready_fd, b"ready\n")
            os.close(args.ready_fd)
    line = sys.stdin.buffer.readline()
    if not line:
        return 0  # the supervisor went away (or closed the pool) before a generation needed us
    try:
        job = json.loads(line)
        cmd = [str(a) for a in job["argv"]]
        env = {str(k): str(v) for k, v in dict(job["env"]).items()}
        cwd = str(job.get("cwd") or os.getcwd())
        script = cmd[1]
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        sys.stderr.write(f"ftd run: warm interpreter got a bad start line: {exc}\n")
        return 2
    devnull = os.open(os.devnull, os.O_RDONLY)  # the script must not read the supervisor's pipe
    os.dup2(devnull, 0)
    os.close(devnull)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    os.environ[READY_AT_ENV] = repr(ready_at)
    sys.argv = cmd[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
