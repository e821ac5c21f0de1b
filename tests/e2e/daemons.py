"""Run ``ftd agent`` / ``ftd coordinator`` as real subprocesses with config files, for e2e tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Daemon:
    name: str
    config_text: str
    workdir: Path
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] | None = None  # added to the environment (e.g. systemd's CREDENTIALS_DIRECTORY)

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name}.log"

    def start(self) -> Daemon:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / f"{self.name}.toml"
        config.write_text(self.config_text)
        role = self.name.split("-")[0]
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ftd.cli", role, "--config", str(config)],
            stdout=log,
            stderr=log,
            cwd=REPO,
            env={**os.environ, **self.env} if self.env else None,
        )
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_log(self, needle: str, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.log():
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.proc.returncode}:\n{self.log()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self.name}: {needle!r} not logged after {timeout}s:\n{self.log()[-3000:]}"
                )
            time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
