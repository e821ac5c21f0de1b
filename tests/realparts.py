"""Start the real parts tests need — Mosquitto, Slurm — on free ports, and stop them by pid.

A missing binary skips the test locally but *fails* it when ``FTD_REQUIRE_REAL=1`` (CI), so a
broken install can never turn the real-part tests into silent skips.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ftd.bench.postgres import LocalPostgres, PostgresMissing, find_bindir
from ftd.bench.slurm_cluster import PartMissing, find_binary, free_port, wait_port
from ftd.bench.slurm_cluster import SlurmCluster as BenchSlurmCluster
from ftd.bench.slurm_cluster import ensure_munged as _ensure_munged

REQUIRE_REAL = os.environ.get("FTD_REQUIRE_REAL") == "1"


__all__ = [
    "REQUIRE_REAL",
    "Mosquitto",
    "SlurmCluster",
    "ensure_munged",
    "free_port",
    "fresh_database",
    "parse_scontrol_oneliner",
    "require_binary",
    "require_postgres",
    "start_postgres",
    "wait_port",
]


def require_binary(name: str, *, package: str) -> str:
    """The binary's path; a missing one skips the test, or fails it under ``FTD_REQUIRE_REAL=1``."""
    try:
        return find_binary(name, package=package)
    except PartMissing as exc:
        if REQUIRE_REAL:
            pytest.fail(f"FTD_REQUIRE_REAL=1 and {exc}", pytrace=False)
        pytest.skip(str(exc))


@dataclass
class Mosquitto:
    """A private Mosquitto on loopback. ``extra_conf`` lines are appended to its config."""

    workdir: Path
    port: int = 0
    extra_conf: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def conf_path(self) -> Path:
        return self.workdir / "mosquitto.conf"

    @property
    def log_path(self) -> Path:
        return self.workdir / "mosquitto.log"

    def start(self) -> Mosquitto:
        binary = require_binary("mosquitto", package="mosquitto")
        self.workdir.mkdir(parents=True, exist_ok=True)
        if not self.port:
            self.port = free_port()
        lines = [
            f"listener {self.port} 127.0.0.1",
            "log_dest stderr",
            "log_type error",
            "log_type warning",
            "persistence true",
            # Started as root, Mosquitto drops to the `mosquitto` user, which cannot write its session
            # database into a root-owned temp dir: sessions would silently not survive a restart.
            "user root",
            "set_tcp_nodelay true",
            f"persistence_location {self.workdir}/",
        ]
        if not any(line.startswith("allow_anonymous") for line in self.extra_conf):
            lines.append("allow_anonymous true")
        self.conf_path.write_text("\n".join(lines + self.extra_conf) + "\n")
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen([binary, "-c", str(self.conf_path)], stdout=log, stderr=log)
        try:
            wait_port(self.port)
        except TimeoutError:
            self.stop()
            raise RuntimeError(f"mosquitto did not start: {self.log_path.read_text()[-2000:]}") from None
        return self

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


# --------------------------------------------------------------------------------------------------
# Slurm: munged (shared, reused if running) + a private slurmctld and one slurmd on free ports.
# --------------------------------------------------------------------------------------------------


def ensure_munged() -> None:
    """Reuse a running munged; otherwise start one (skipped, or failed in CI, without munge)."""
    _ensure_munged(require_binary)


def parse_scontrol_oneliner(line: str) -> dict[str, str]:
    """Parse one ``scontrol show ... -o`` line into ``{Key: value}`` (the parser ftd itself uses)."""
    from ftd.coordinator.actions.slurm import parse_oneliner

    return parse_oneliner(line)


class SlurmCluster(BenchSlurmCluster):
    """:class:`ftd.bench.slurm_cluster.SlurmCluster` (node-1 runs jobs; node-2..N without a daemon)
    whose missing binaries skip the test, or fail it under ``FTD_REQUIRE_REAL=1``."""

    def require(self, name: str, *, package: str) -> str:
        return require_binary(name, package=package)


# --------------------------------------------------------------------------------------------------
# PostgreSQL (the HA ledger): initdb + pg_ctl from Debian's postgresql package, on a free port.
# --------------------------------------------------------------------------------------------------


def start_postgres(workdir: Path) -> LocalPostgres:
    """A private PostgreSQL (``ftd.bench.postgres.LocalPostgres``); skipped when the package is
    missing, failed instead under ``FTD_REQUIRE_REAL=1``."""
    require_postgres()
    return LocalPostgres(workdir).start()


_database_numbers = itertools.count()


def fresh_database(server: LocalPostgres, prefix: str = "test") -> str:
    """The dsn of a new, empty database on ``server``: tests share a server, never tables."""
    import psycopg

    name = f"{prefix}_{next(_database_numbers)}"
    with psycopg.connect(server.dsn, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    return server.dsn.replace("dbname=ftd", f"dbname={name}")


def require_postgres() -> None:
    """PostgreSQL's server tools and psycopg are installed (else skip; fail under FTD_REQUIRE_REAL=1)."""
    try:
        find_bindir()
    except PostgresMissing as exc:
        if REQUIRE_REAL:
            pytest.fail(f"FTD_REQUIRE_REAL=1 and {exc}", pytrace=False)
        pytest.skip(str(exc))
    try:
        import psycopg  # noqa: F401
    except ImportError:
        msg = "psycopg not installed (pip install 'ftd-daemon[ha]')"
        if REQUIRE_REAL:
            pytest.fail(f"FTD_REQUIRE_REAL=1 and {msg}", pytrace=False)
        pytest.skip(msg)
