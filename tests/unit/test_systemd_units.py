"""The systemd unit verifies, carries its hardening, and sd_notify speaks the real protocol."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ftd.sdnotify import notify, watchdog_interval_s

UNIT = Path(__file__).resolve().parents[2] / "systemd" / "ftd-agent.service"


def settings(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "[")) and "=" in line:
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian package `systemd`)")
    ftd = Path(sys.executable).with_name("ftd")
    text = UNIT.read_text()
    if ftd.exists():  # verify checks that the executable exists: point it at this venv's ftd
        text = text.replace("ExecStart=/usr/bin/env ftd ", f"ExecStart={ftd} ")
    copy = tmp_path / "ftd-agent.service"
    copy.write_text(text)
    result = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True, timeout=60)
    problems = [line for line in (result.stdout + result.stderr).splitlines() if "ftd-agent.service" in line]
    assert result.returncode == 0 and not problems, result.stdout + result.stderr


def test_unit_has_the_required_service_settings_and_hardening() -> None:
    conf = settings(UNIT.read_text())
    expected = {
        "Type": "notify",
        "NotifyAccess": "main",
        "WatchdogSec": "30",
        "Restart": "always",
        "RestartSec": "2",
        "LoadCredential": "broker-password:/etc/ftd/broker-password",
        "StateDirectory": "ftd",
        "RuntimeDirectory": "ftd",
        "ProtectSystem": "strict",
        "PrivateTmp": "yes",
        "NoNewPrivileges": "yes",
        "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6 AF_NETLINK",
        "ProtectKernelTunables": "yes",
        "ProtectControlGroups": "yes",
        "LockPersonality": "yes",
        "MemoryDenyWriteExecute": "yes",
        "SystemCallArchitectures": "native",
    }
    for key, value in expected.items():
        assert conf.get(key) == [value], (key, conf.get(key))
    assert conf["ProtectHome"][0] in ("yes", "read-only")
    assert "ftd agent --config /etc/ftd/agent.toml" in conf["ExecStart"][0]
    assert "/dev/kmsg r" in conf["DeviceAllow"]  # the kernel log stays readable
    assert any("nvidia" in allow for allow in conf["DeviceAllow"])  # GPU reset and NVML
    assert "CAP_SYSLOG" in conf["CapabilityBoundingSet"][0]
    assert conf.get("PrivateDevices", ["no"]) == ["no"]  # would hide /dev/kmsg and /dev/nvidia*
    assert conf.get("ProtectKernelLogs", ["no"]) == ["no"]  # would deny /dev/kmsg


def test_notify_sends_ready_and_watchdog_datagrams(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(path)
        server.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        assert notify("READY=1")
        assert notify("WATCHDOG=1")
        assert server.recv(4096) == b"READY=1"
        assert server.recv(4096) == b"WATCHDOG=1"


def test_notify_abstract_socket_and_no_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"ftd-test-notify-{id(monkeypatch)}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind("\0" + name)
        server.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert notify("READY=1")
        assert server.recv(4096) == b"READY=1"
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert notify("READY=1") is False
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    assert watchdog_interval_s() == 15.0
