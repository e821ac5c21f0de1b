"""``ftd agent`` / ``ftd coordinator`` as real subprocesses with config files, for benches and e2e tests.

What: :class:`Daemon` writes its TOML to ``<workdir>/<name>.toml``, runs ``python -m ftd.cli ROLE
--config ...`` (the role is the name's first word: ``agent-node-1`` -> ``agent``) with stdout and
stderr appended to ``<workdir>/<name>.log``, waits for a line in that log, and stops it (SIGTERM,
or any signal: SIGKILL for a crash, then SIGKILL after 10 s). Why in the package: ``ftd bench
recovery`` starts an agent per node and a coordinator without the test tree; the e2e tests'
``tests/e2e/daemons.py`` is this class run from the checkout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Daemon"]


@dataclass
class Daemon:
    name: str
    config_text: str
    workdir: Path
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] | None = None  # added to the environment (e.g. systemd's CREDENTIALS_DIRECTORY)
    cwd: Path | None = None  # where the daemon runs (None: this process's directory)

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name}.log"

    @property
    def config_path(self) -> Path:
        return self.workdir / f"{self.name}.toml"

    def start(self) -> Daemon:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self.config_text)
        role = self.name.split("-")[0]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ftd.cli", role, "--config", str(self.config_path)],
                stdout=log,
                stderr=log,
                cwd=self.cwd,
                env={**os.environ, **self.env} if self.env else None,
            )
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_log(self, needle: str, timeout: float = 60.0, *, after: int = 0) -> None:
        """Until ``needle`` is in the log (past character ``after``); raises if the daemon exits first.

        The default is generous: a daemon's start is an interpreter importing ftd, which took 15 s on
        the two-core machine at load 14 (a fixture that gave it 15 s failed with the line written just
        after its last look). Waiting longer costs nothing when it comes sooner."""
        deadline = time.monotonic() + timeout
        while needle not in self.log()[after:]:
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
