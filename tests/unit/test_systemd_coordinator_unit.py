"""systemd/ftd-coordinator.service: valid for systemd itself, and hardened the way the design says."""

from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

import pytest

from tests.realparts import require_binary

UNIT = Path(__file__).resolve().parents[2] / "systemd" / "ftd-coordinator.service"
FTD = Path(sys.executable).with_name("ftd")


def settings() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for raw in UNIT.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", "[")):
            continue
        key, _, value = line.partition("=")
        out.setdefault(key.strip(), []).append(value.strip())
    return out


@pytest.mark.real
def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    analyze = require_binary("systemd-analyze", package="systemd")
    # verify checks that the executable exists: point the installed path at this venv's ftd
    copy = tmp_path / UNIT.name
    copy.write_text(UNIT.read_text().replace("ExecStart=/opt/ftd/bin/ftd ", f"ExecStart={FTD} "))
    result = subprocess.run(
        [analyze, "verify", str(copy)], capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False
    )
    assert result.returncode == 0, result.stderr
    # verify reports unknown or misspelt settings as warnings on stderr without failing.
    assert "Unknown key" not in result.stderr and "Failed to parse" not in result.stderr, result.stderr


def test_unit_is_a_notify_service_with_watchdog_state_and_credentials() -> None:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.read_string(UNIT.read_text())  # well-formed INI sections
    assert {"Unit", "Service", "Install"} <= set(parser.sections())
    s = settings()
    assert s["Type"] == ["notify"]
    assert int(s["WatchdogSec"][0]) > 0
    assert s["Restart"] == ["always"]
    assert s["StateDirectory"] == ["ftd"]
    assert "ftd coordinator --config /etc/ftd/coordinator.toml" in s["ExecStart"][0]
    creds = {c.split(":")[0] for c in s["LoadCredential"]}
    assert creds == {"api-token"}  # the broker password (no client certificates) is commented out


def test_unit_is_hardened_without_devices_kernel_log_or_capabilities() -> None:
    s = settings()
    assert s["CapabilityBoundingSet"] == [""]
    for key in (
        "PrivateDevices",
        "ProtectKernelLogs",
        "ProtectKernelTunables",
        "ProtectKernelModules",
        "ProtectControlGroups",
        "NoNewPrivileges",
        "PrivateTmp",
        "RestrictSUIDSGID",
        "MemoryDenyWriteExecute",
    ):
        assert s[key] == ["yes"], key
    assert s["ProtectSystem"] == ["strict"]
    assert "DeviceAllow" not in s
    assert "AF_NETLINK" not in s["RestrictAddressFamilies"][0]


@pytest.mark.real
def test_security_exposure_is_low(tmp_path: Path) -> None:
    analyze = require_binary("systemd-analyze", package="systemd")
    result = subprocess.run(
        [analyze, "security", "--offline=yes", "--threshold=30", str(UNIT)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
    )
    if "--offline" in result.stderr and "unrecognized" in result.stderr:
        pytest.skip("this systemd-analyze has no offline security mode")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
