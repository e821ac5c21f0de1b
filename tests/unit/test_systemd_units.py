"""The systemd unit verifies, carries its hardening, and sd_notify speaks the real protocol."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ftd.sdnotify import notify, watchdog_interval_s
from tests.realparts import require_binary

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
    analyze = require_binary("systemd-analyze", package="systemd")
    ftd = Path(sys.executable).with_name("ftd")
    text = UNIT.read_text()
    if ftd.exists():  # verify checks that the executable exists: point it at this venv's ftd
        text = text.replace("ExecStart=/opt/ftd/bin/ftd ", f"ExecStart={ftd} ")
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
    # mutual TLS needs no credential; a LoadCredential= whose file is missing would stop the unit
    assert "LoadCredential" not in conf
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


def test_notify_never_waits_for_a_reader_that_fell_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A notify socket nobody reads fills up (net.unix.max_dgram_qlen datagrams, 10 by default); a
    blocking send then waits for the reader, on the daemon's event loop. It drops the message instead."""
    path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(path)
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        sent: list[bool] = []
        sender = threading.Thread(target=lambda: sent.extend(notify("WATCHDOG=1") for _ in range(600)))
        sender.start()
        sender.join(timeout=10)
        stuck = sender.is_alive()
    sender.join()  # closing the socket releases a sender stuck on the old code
    assert not stuck, "notify() blocked on a full notify socket"
    assert sent[0] and not sent[-1]  # the first ones queued, the overflow dropped


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


# --- diagnostics (py-spy) under the unit's sandbox ------------------------------------------------


def _expand_syscall_group(analyze: str, name: str, seen: set[str] | None = None) -> set[str]:
    """The system calls of ``@group`` (recursively), from ``systemd-analyze syscall-filter``."""
    seen = set() if seen is None else seen
    if name in seen:
        return set()
    seen.add(name)
    out = subprocess.run([analyze, "syscall-filter", name], capture_output=True, text=True, timeout=60)
    calls: set[str] = set()
    for line in out.stdout.splitlines()[1:]:
        item = line.strip()
        if not item or item.startswith("#"):
            continue
        calls |= _expand_syscall_group(analyze, item, seen) if item.startswith("@") else {item}
    return calls


def allowed_syscalls(conf: dict[str, list[str]], analyze: str | None) -> tuple[set[str], set[str]]:
    """(explicitly or group-allowed system calls, denied ones) of the unit's SystemCallFilter lines.

    Without systemd-analyze the groups cannot be expanded: only the names listed are known."""
    allowed: set[str] = set()
    denied: set[str] = set()
    for line in conf.get("SystemCallFilter", []):
        deny = line.startswith("~")
        for item in line.lstrip("~").split():
            names = _expand_syscall_group(analyze, item) if item.startswith("@") and analyze else {item}
            (denied if deny else allowed).update(names)
    return allowed, denied


def test_unit_lets_py_spy_run_as_the_diagnostics_code_requires() -> None:
    """Finding (issue #11): the shipped unit had no CAP_SYS_PTRACE and @system-service has no ptrace,
    so collect_diagnostics failed in production as shipped. The requirement comes from the code."""
    from ftd.agent.diagnostics import REQUIRED_CAPABILITIES, REQUIRED_SYSCALLS

    conf = settings(UNIT.read_text())
    bounding = conf["CapabilityBoundingSet"][0].split()
    for cap in REQUIRED_CAPABILITIES:
        assert cap in bounding, f"{cap} missing from CapabilityBoundingSet {bounding}"
        if conf.get("User", ["root"])[0] not in ("root", "0"):  # a non-root service needs them ambient
            assert cap in conf.get("AmbientCapabilities", [""])[0].split(), cap
    allowed, denied = allowed_syscalls(conf, shutil.which("systemd-analyze"))
    for call in REQUIRED_SYSCALLS:
        assert call in allowed and call not in denied, f"system call {call} is filtered out"
    # Each exception is commented with why (the line above it names the syscall or capability).
    lines = UNIT.read_text().splitlines()
    for needle in ("CapabilityBoundingSet=", "SystemCallFilter=ptrace"):
        index = next(i for i, line in enumerate(lines) if line.startswith(needle))
        assert lines[index - 1].startswith("#") and "py-spy" in "\n".join(lines[index - 4 : index]), needle


def test_py_spy_needs_no_system_call_beyond_the_unit_filter(tmp_path: Path) -> None:
    """Re-measure the requirement: py-spy dump of a live Python, under strace: every system call it
    makes that @system-service lacks is in REQUIRED_SYSCALLS (so the constant cannot go stale)."""
    from ftd.agent.diagnostics import REQUIRED_SYSCALLS

    analyze = require_binary("systemd-analyze", package="systemd")
    strace = shutil.which("strace")  # a measuring tool, not a part ftd runs with: skip without it
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if strace is None or not Path(spy).exists():
        pytest.skip("needs strace (Debian package strace) and py-spy (pip install 'ftd-daemon[daemon]')")
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        summary = tmp_path / "strace.txt"
        for _ in range(50):  # until the target's interpreter is up (py-spy fails before that)
            done = subprocess.run(
                [strace, "-f", "-qq", "-c", "-o", str(summary), spy, "dump", "--pid", str(target.pid)],
                capture_output=True,
                text=True,
                timeout=60,
            )
            if done.returncode == 0:
                break
        assert done.returncode == 0, done.stderr
    finally:
        target.kill()
        target.wait()
    used = {
        line.split()[-1]
        for line in summary.read_text().splitlines()[2:]
        if line.strip() and not line.startswith("-") and line.split()[-1] != "total"
    }
    service = _expand_syscall_group(analyze, "@system-service")
    assert {"ptrace", "process_vm_readv"} <= used, used  # the measurement measured something
    assert used - service <= set(REQUIRED_SYSCALLS), used - service
