"""Start the real parts tests need — Mosquitto, Slurm — on free ports, and stop them by pid.

A missing binary skips the test locally but *fails* it when ``FTD_REQUIRE_REAL=1`` (CI), so a
broken install can never turn the real-part tests into silent skips.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REQUIRE_REAL = os.environ.get("FTD_REQUIRE_REAL") == "1"


def require_binary(name: str, *, package: str) -> str:
    path = shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.path.exists(p)), None
    )
    if path is None:
        msg = f"{name} not found (Debian package {package}); `make test` installs it"
        if REQUIRE_REAL:
            pytest.fail(f"FTD_REQUIRE_REAL=1 and {msg}", pytrace=False)
        pytest.skip(msg)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


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
