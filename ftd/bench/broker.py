"""A private Mosquitto on a free loopback port, for benchmarks that need the real broker."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from ftd.bench.slurm_cluster import free_port


class PrivateMosquitto:
    def __init__(self, extra_conf: tuple[str, ...] = (), *, anonymous: bool = True) -> None:
        self._extra_conf = extra_conf
        self._anonymous = anonymous
        binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        if not Path(binary).exists():
            raise RuntimeError(
                "mosquitto not found: install the Debian package `mosquitto` (make real-parts)"
            )
        self._binary = binary
        self._dir = tempfile.TemporaryDirectory(prefix="ftd-bench-mosq-")
        self.port = free_port()
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> PrivateMosquitto:
        conf = Path(self._dir.name) / "mosquitto.conf"
        lines = [
            f"listener {self.port} 127.0.0.1",
            f"allow_anonymous {'true' if self._anonymous else 'false'}",
            "log_dest none",
            "set_tcp_nodelay true",
        ]
        conf.write_text("\n".join([*lines, *self._extra_conf]) + "\n")
        self._proc = subprocess.Popen([self._binary, "-c", str(conf)])
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                if time.monotonic() > deadline:
                    self._proc.kill()
                    self._proc.wait(5)
                    raise RuntimeError("mosquitto did not start") from None
                time.sleep(0.02)

    @property
    def pid(self) -> int:
        """The broker's process id (for its RSS and CPU time)."""
        assert self._proc is not None, "not started"
        return self._proc.pid

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(5)
        self._dir.cleanup()
