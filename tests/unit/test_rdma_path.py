"""The RDMA path's pure parts: NCCL init lines read for the transport, ACS in config space, the verdict."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ftd.pci import ACS_CAP_ID, acs_control, ext_capability
from ftd.platform.nccl_init import NcclTransport, sighting
from ftd.platform.rdma import UNLIMITED, AcsPort, Fact, PathFacts, Thresholds, judge
from tests.properties import examples

# Our own samples in NCCL 2.x's INFO format (host:pid:tid [dev] NCCL INFO ...).
IB_PLUGIN = (
    "gpu-a07:81234:81234 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_3:1/IB ; OOB bond0:10.4.2.7<0>"
)
SOCKET_PLUGIN = "gpu-a07:81234:81234 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>"
USING_IB = "gpu-a07:81234:81234 [0] NCCL INFO Using network IB"
USING_SOCKET = "gpu-a07:81234:81234 [0] NCCL INFO Using network Socket"
CH_GDR = "gpu-a07:81234:81301 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA"
CH_STAGED = "gpu-a07:81234:81301 [0] NCCL INFO Channel 01/0 : 8[0] -> 0[0] [receive] via NET/IB/1"
CH_SOCKET = "gpu-a07:81234:81301 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/Socket/0"
CH_P2P = "gpu-a07:81234:81301 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read"


@pytest.mark.parametrize(
    ("line", "net", "gdrdma"),
    [
        (IB_PLUGIN, "ib", None),
        (SOCKET_PLUGIN, "socket", None),
        (USING_IB, "ib", None),
        (USING_SOCKET, "socket", None),
        (CH_GDR, "ib", True),
        (CH_STAGED, "ib", False),
        (CH_SOCKET, "socket", False),
        ("x NCCL INFO NET/OFI : Using [0]efa0 ...", "other", None),
    ],
)
def test_each_transport_line_says_its_network(line: str, net: str, gdrdma: bool | None) -> None:
    seen = sighting(line)
    assert seen is not None
    assert seen.net == net
    assert seen.gdrdma is gdrdma


def test_the_plugin_line_names_its_devices_and_other_lines_say_nothing() -> None:
    seen = sighting(IB_PLUGIN)
    assert seen is not None and seen.devices == ("mlx5_0:1/IB", "mlx5_3:1/IB")
    assert sighting(CH_P2P) is None
    assert sighting("NCCL WARN NET/Socket : something") is None
    assert sighting("epoch 3 loss 0.12") is None


@settings(max_examples=examples(300))
@given(
    st.text(max_size=300), st.sampled_from(["", "NCCL INFO ", "NCCL INFO NET/", "NCCL INFO Channel 0/0 : "])
)
def test_any_text_is_read_without_error(text: str, prefix: str) -> None:
    seen = sighting(prefix + text)
    assert seen is None or seen.net in ("ib", "socket", "other")


@settings(max_examples=examples(200))
@given(st.text(alphabet="abc-0123456789:[] ", max_size=40))
def test_a_socket_line_is_socket_whatever_precedes_it(prefix: str) -> None:
    seen = sighting(prefix + " NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>")
    assert seen is not None and seen.net == "socket"


def _config(caps: list[tuple[int, bytes]], size: int = 4096) -> bytes:
    """A config space with extended capabilities at the given offsets, chained in order."""
    space = bytearray(size)
    for i, (offset, body) in enumerate(caps):
        cap_id = int.from_bytes(body[:2], "little")
        nxt = caps[i + 1][0] if i + 1 < len(caps) else 0
        header = cap_id | (1 << 16) | (nxt << 20)
        space[offset : offset + 4] = header.to_bytes(4, "little")
        space[offset + 4 : offset + len(body) + 2] = body[2:]
    return bytes(space)


def test_acs_control_is_found_by_walking_the_extended_list() -> None:
    aer = (0x0001).to_bytes(2, "little") + bytes(10)
    acs = (
        ACS_CAP_ID.to_bytes(2, "little")  # then the capability register (+4) and the control (+6)
        + (0x005F).to_bytes(2, "little")
        + (0x001D).to_bytes(2, "little")
    )
    space = _config([(0x100, aer), (0x148, acs)])
    assert ext_capability(space, ACS_CAP_ID) == 0x148
    assert acs_control(space) == 0x001D
    assert AcsPort("0000:00:01.0", 0x001D).redirects  # bit 2 (RR) and bit 3 (CR) set
    assert not AcsPort("0000:00:01.0", 0x0001).redirects
    assert acs_control(_config([(0x100, aer)])) is None  # no ACS: None, not an error


def test_a_short_config_space_is_unreadable_not_absent() -> None:
    with pytest.raises(ValueError, match="not readable"):
        acs_control(bytes(64))  # what a non-root reader gets


@settings(max_examples=examples(300))
@given(st.binary(min_size=0, max_size=4200))
def test_any_config_space_is_walked_without_error(space: bytes) -> None:
    try:
        value = acs_control(space)
    except ValueError:
        assert len(space) < 0x104
    else:
        assert value is None or 0 <= value < 1 << 16


def _ib_facts(**kw: object) -> PathFacts:
    base = PathFacts(
        ib_cluster=Fact(True),
        peermem=Fact(True),
        memlock={10: Fact(UNLIMITED)},
        shm={10: Fact(8 << 30)},
        acs=Fact([AcsPort("0000:00:01.0", 0)]),
        iommu=Fact("off"),
        rendezvous=Fact("ok"),
        nccl=NcclTransport(),
    )
    for key, value in kw.items():
        setattr(base, key, value)
    return base


def test_a_healthy_ib_job_passes_only_what_was_read() -> None:
    verdict = judge(_ib_facts())
    assert verdict.causes == []
    # No NCCL line yet: unknown with the reason, never passed.
    assert verdict.verdict == "unknown" and "nccl_transport" in verdict.unknown
    nccl = NcclTransport()
    for line in (IB_PLUGIN, CH_GDR):
        seen = sighting(line)
        assert seen is not None
        nccl.add(seen)
    assert judge(_ib_facts(nccl=nccl)).verdict == "ok"


@pytest.mark.parametrize(
    ("change", "cause", "severity"),
    [
        ({"memlock": {10: Fact(64 << 10)}}, "memlock_low", "error"),
        ({"peermem": Fact(False)}, "no_peermem", "error"),
        ({"shm": {10: Fact(64 << 20)}}, "shm_small", "warning"),
        ({"acs": Fact([AcsPort("0000:00:01.0", 0x1D)])}, "acs_enabled", "warning"),
        ({"iommu": Fact("translated")}, "iommu_translated", "warning"),
        ({"rendezvous": Fact("ConnectionRefusedError: refused")}, "rendezvous_unreachable", "error"),
    ],
)
def test_each_slow_path_is_named(change: dict[str, object], cause: str, severity: str) -> None:
    verdict = judge(_ib_facts(**change))
    assert [c.name for c in verdict.causes] == [cause]
    assert verdict.severity == severity
    assert verdict.to_dict()["causes"] == [cause]


def test_nccl_on_socket_is_a_cause_on_ib_only() -> None:
    nccl = NcclTransport()
    seen = sighting(SOCKET_PLUGIN)
    assert seen is not None
    nccl.add(seen)
    assert [c.name for c in judge(_ib_facts(nccl=nccl)).causes] == ["nccl_socket"]
    ethernet = judge(_ib_facts(nccl=nccl, ib_cluster=Fact(False), peermem=Fact(False)))
    assert ethernet.causes == []
    unknown_ib = judge(_ib_facts(nccl=nccl, ib_cluster=Fact.unknown("sysfs unreadable")))
    assert unknown_ib.causes == [] and "sysfs unreadable" in unknown_ib.unknown["nccl_transport"]


def test_ib_without_gdrdma_is_a_warning() -> None:
    nccl = NcclTransport()
    seen = sighting(CH_STAGED)
    assert seen is not None
    nccl.add(seen)
    assert [c.name for c in judge(_ib_facts(nccl=nccl)).causes] == ["nccl_no_gdrdma"]


def test_an_unread_fact_is_unknown_with_its_reason_never_a_pass() -> None:
    verdict = judge(
        _ib_facts(
            memlock={10: Fact.unknown("/proc/10/limits: PermissionError")},
            peermem=Fact.unknown("/proc/modules: gone"),
            acs=Fact.unknown("config: 64 bytes"),
        )
    )
    assert verdict.causes == []
    assert "PermissionError" in verdict.unknown["memlock"]
    assert verdict.unknown["peermem"] == "/proc/modules: gone"
    assert verdict.unknown["acs"] == "config: 64 bytes"
    assert not {"memlock", "peermem", "acs"} & set(verdict.passed)
    assert judge(_ib_facts(memlock={}, shm={})).unknown["shm"] == "no rank process known"


def test_thresholds_are_the_callers() -> None:
    facts = _ib_facts(memlock={10: Fact(512 << 20)})
    assert judge(facts).causes[0].name == "memlock_low"
    assert judge(facts, Thresholds(min_memlock_bytes=256 << 20)).causes == []


@settings(max_examples=examples(200))
@given(st.text(max_size=400), st.sampled_from(["", "Max locked memory", "Max locked memory   "]))
@example(text="\u00b2", prefix="Max locked memory")  # CI found it: a digit to isdigit(), not to int()
@example(text=" \u0663\u0660", prefix="Max locked memory")  # Arabic-Indic digits: int() reads them
def test_any_limits_file_is_a_value_or_unknown(text: str, prefix: str) -> None:
    import tempfile
    from pathlib import Path

    from ftd.agent.job_checks.facts import memlock

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "7").mkdir()
        (Path(tmp) / "7" / "limits").write_text(prefix + text, errors="surrogatepass")
        fact = memlock(7, Path(tmp))
    assert (fact.value is None) == bool(fact.why)
    assert fact.value is None or fact.value >= 0


def test_the_real_limits_format_is_read() -> None:
    import tempfile
    from pathlib import Path

    from ftd.agent.job_checks.facts import memlock

    row = "Max locked memory         {}               {}               bytes     \n"
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "7").mkdir()
        limits = Path(tmp) / "7" / "limits"
        limits.write_text("Limit                     Soft Limit           Hard Limit           Units     \n")
        limits.write_text(limits.read_text() + row.format(65536, 65536))
        assert memlock(7, Path(tmp)).value == 65536
        limits.write_text(row.format("unlimited", "unlimited"))
        assert memlock(7, Path(tmp)).value == UNLIMITED
        limits.write_text("Max open files 1024 1024 files\n")
        assert "no 'Max locked memory' line" in memlock(7, Path(tmp)).why


@settings(max_examples=examples(200))
@given(st.binary(max_size=2000))
def test_any_kmsg_bytes_give_a_window_without_error(raw: bytes) -> None:
    import tempfile
    from pathlib import Path

    from ftd.agent.rma.bundle import kmsg_window

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kmsg"
        path.write_bytes(raw)
        text, why = kmsg_window(str(path), 60.0, now_us=10**12)
    assert why is None and isinstance(text, str)
