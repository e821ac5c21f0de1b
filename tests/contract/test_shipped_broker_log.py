"""The shipped broker starts without complaint: Mosquitto's start log for deploy/mosquitto (config and
ACL as shipped) holds no warning or recommendation, except the one the ACL documents.

Why: an operator who sees a warning at every start learns to ignore the broker's log. The one left
is Mosquitto's remark on ``pattern read ftd/v1/coordinator/status`` (no ``%u``/``%c``): the topic
every node reads, for which a ``pattern`` line is Mosquitto's only grant to every user; the ACL
says so beside the line, and this test fails on any other.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.realparts import Mosquitto

pytestmark = pytest.mark.real

DOCUMENTED = {"Warning: ACL pattern 'ftd/v1/coordinator/status' does not contain '%c' or '%u'."}
# The test broker's own `user root` (tests/realparts.Mosquitto: its files live in a root-owned temp
# directory); the shipped config sets no user, so Debian's mosquitto runs as `mosquitto`.
TEST_HARNESS = "Warning: Mosquitto should not be run as root/administrator."


def test_the_shipped_broker_logs_no_warning_at_start(shipped_broker: tuple[Mosquitto, Path]) -> None:
    broker, _ = shipped_broker
    log = broker.log_path.read_text()
    assert "running" in log, log
    remarks = {
        re.sub(r"^\d+: ", "", line)
        for line in log.splitlines()
        if re.search(r"\b(warning|note|deprecated|recommended)\b", line, re.IGNORECASE)
    }
    assert remarks - {TEST_HARNESS} == DOCUMENTED, log
    acl = (Path(__file__).resolve().parents[2] / "deploy" / "mosquitto" / "acl").read_text()
    assert "does not contain '%c' or '%u'" in acl  # the ACL explains the one it keeps
