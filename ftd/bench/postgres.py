"""A private PostgreSQL on loopback, for ``ftd bench failover`` and the tests (``tests/realparts.py``).

Uses the server tools of Debian's ``postgresql`` package (``/usr/lib/postgresql/*/bin``): ``initdb``
on a fresh directory (trust authentication, user ``ftd``), ``pg_ctl start`` on a free port with the
socket in that directory. ``initdb`` refuses to run as root: as root the directory is handed to the
``postgres`` user the package creates and both tools run as that user (``runuser``), in a directory
of its own under the system temp dir (a test's ``tmp_path`` is private to root, so ``postgres`` could
not reach a data directory inside it; ``workdir`` then only records where it went). Stopped with
``pg_ctl stop -m immediate`` (no shutdown checkpoint: the SIGKILL-like stop) unless asked otherwise.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ftd.bench.slurm_cluster import free_port


class PostgresMissing(RuntimeError):
    """The PostgreSQL server tools are not installed."""


def find_bindir() -> Path:
    """The newest ``/usr/lib/postgresql/N/bin`` holding ``initdb`` (or ``initdb`` on PATH)."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdecimal() else 0,
    )
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).parent
    raise PostgresMissing(
        "PostgreSQL server tools not found (Debian package postgresql); make real-parts installs it"
    )


@dataclass
class LocalPostgres:
    workdir: Path
    port: int = 0
    user: str = "ftd"
    database: str = "ftd"

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user={self.user} dbname={self.database}"

    rundir: Path | None = None  # where the server's files live (see the module docstring)

    @property
    def datadir(self) -> Path:
        return self.home / "data"

    @property
    def home(self) -> Path:
        return self.rundir or self.workdir

    def _run(self, argv: list[str], timeout: float = 60.0) -> None:
        if os.geteuid() == 0:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-2000:]}")

    def start(self) -> LocalPostgres:
        bindir = find_bindir()
        self.workdir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0 and self.rundir is None:
            self.rundir = Path(tempfile.mkdtemp(prefix="ftd-pg-"))
            shutil.chown(self.rundir, "postgres", "postgres")
            (self.workdir / "rundir").write_text(str(self.rundir))
        if not self.port:
            self.port = free_port()
        if not self.datadir.exists():
            self._run([str(bindir / "initdb"), "-D", str(self.datadir), "-A", "trust", "-U", self.user, "-N"])
        opts = f"-p {self.port} -k {self.home} -c listen_addresses=127.0.0.1 -c fsync=off"
        log = self.home / "postgres.log"
        pg_ctl = str(bindir / "pg_ctl")
        self._run([pg_ctl, "-D", str(self.datadir), "-o", opts, "-l", str(log), "-w", "start"])
        self._createdb(bindir)
        return self

    def _createdb(self, bindir: Path) -> None:
        deadline = time.monotonic() + 30
        where = ["-h", "127.0.0.1", "-p", str(self.port), "-U", self.user]
        argv = [str(bindir / "createdb"), *where, self.database]
        while True:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode == 0 or "already exists" in done.stderr:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"createdb failed: {done.stderr[-2000:]}")
            time.sleep(0.1)

    def stop(self, mode: str = "immediate") -> None:
        if (self.datadir / "postmaster.pid").exists():
            self._run([str(find_bindir() / "pg_ctl"), "-D", str(self.datadir), "-m", mode, "-w", "stop"])

    def remove(self) -> None:
        """Stop, and delete a run directory made under the system temp dir."""
        self.stop()
        if self.rundir is not None:
            shutil.rmtree(self.rundir, ignore_errors=True)
            self.rundir = None

    def log(self, tail: int = 3000) -> str:
        path = self.home / "postgres.log"
        return path.read_text(errors="replace")[-tail:] if path.exists() else ""
