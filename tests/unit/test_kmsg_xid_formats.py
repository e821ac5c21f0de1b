"""Every Xid line format NVIDIA drivers have printed, as properties (issue #23 part 5, docs/signals.md).

The address forms (with and without the ``PCI:`` prefix, the domain, the function; the 2000s
``(0001:00)`` bus form; no address at all; addresses redacted in bug reports), SXid register lines
whose header is missing, and the "fallen off the bus" forms (one line with or without a domain, the
three-line banner) -- each under every line prefix the parser knows, with any code and any tail.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftd.agent.kmsg_parse import KernelEvent, KmsgParser, parse_lines
from ftd.events import Kind
from tests.properties import examples
from tests.unit.test_kmsg_parse import PREFIXES

codes = st.integers(0, 99_999)
hexbyte = st.integers(0, 255)
domains = st.integers(0, 0xFFFF)
functions = st.integers(0, 7)
prefixes = st.sampled_from(PREFIXES)
# A tail as drivers print them (pid/name, channel, free text), never a line break.
tails = st.one_of(
    st.just(""),
    st.builds(
        lambda pid, text: f", pid={pid}, name=python3, {text}",
        st.integers(1, 10**7),
        st.text("abc ,:()0x", max_size=30),
    ),
    st.text("abcdefABCDEF0123456789 ,:x", max_size=40).map(lambda t: f", {t}"),
)


def parse(*lines: str) -> list[KernelEvent]:
    return list(parse_lines(lines, KmsgParser()))


def one(line: str) -> KernelEvent:
    events = parse(line)
    assert len(events) == 1, (line, events)
    return events[0]


@settings(max_examples=examples(300))
@given(
    prefixes,
    codes,
    domains,
    hexbyte,
    st.integers(0, 31),
    st.booleans(),
    st.booleans(),
    st.one_of(st.none(), functions),
    tails,
)
def test_every_modern_address_form(
    prefix: str, code: int, domain: int, bus: int, dev: int, pci_word: bool, with_domain: bool,
    function: int | None, tail: str,
) -> None:  # fmt: skip
    address = (f"{domain:04x}:" if with_domain else "") + f"{bus:02x}:{dev:02x}"
    address += f".{function}" if function is not None else ""
    event = one(f"{prefix}NVRM: Xid ({'PCI:' if pci_word else ''}{address}): {code}{tail}")
    want_domain = f"{domain:04x}" if with_domain else "0000"
    assert (event.kind, event.code) == (Kind.XID, code)
    assert event.pci == f"{want_domain}:{bus:02x}:{dev:02x}.{function or 0}"


@settings(max_examples=examples(200))
@given(prefixes, codes, hexbyte, st.integers(0, 31), tails)
def test_2000s_bus_device_form(prefix: str, code: int, bus: int, dev: int, tail: str) -> None:
    """Drivers of the 2000s printed ``Xid (0001:00)``: the bus with four digits, then the device."""
    event = one(f"{prefix}NVRM: Xid ({bus:04x}:{dev:02x}): {code}{tail}")
    assert (event.code, event.pci) == (code, f"0000:{bus:02x}:{dev:02x}.0")


@settings(max_examples=examples(200))
@given(prefixes, codes, st.text("0123456789abcdef ", max_size=40))
def test_oldest_form_without_an_address(prefix: str, code: int, words: str) -> None:
    """``NVRM: Xid: 13, 0000 02005600 00000056 ...``: the code, no address."""
    event = one(f"{prefix}NVRM: Xid: {code}, {words}")
    assert (event.kind, event.code, event.pci) == (Kind.XID, code, None)


def test_forms_that_are_not_xid_lines() -> None:
    """No code after the address, or not a form any driver printed: nothing (peers agree)."""
    for line in (
        "NVRM: Xid (PCI:0000:3d:00): abc, pid=41877",
        "NVRM: Xid (unknown): text lost",
        "NVRM: Xid : 32, pid=41877",
        "NVRM: Xid error: see the previous line",
        "NVRM: Xid (PCI:0000:05:00)",
    ):
        assert parse(line) == [], line


masks = st.sampled_from(["x", "X", "*", "#", "?"])


@settings(max_examples=examples(200))
@given(prefixes, codes, masks, st.booleans(), tails)
def test_redacted_addresses_keep_the_code(
    prefix: str, code: int, mask: str, pci_word: bool, tail: str
) -> None:
    address = f"0000:{mask * 2}:00"
    event = one(f"{prefix}NVRM: Xid ({'PCI:' if pci_word else ''}{address}): {code}{tail}")
    assert (event.code, event.pci) == (code, None)
    assert event.extra["address"] == address and event.extra["address_redacted"] is True


@pytest.mark.parametrize("address", ["<redacted>", "REDACTED", "xxxx:xx:xx.x", "****:**:**"])
def test_redacted_words(address: str) -> None:
    event = one(f"NVRM: Xid (PCI:{address}): 79, pid=1, name=x, GPU has fallen off the bus.")
    assert (event.code, event.pci, event.extra["address_redacted"]) == (79, None, True)


registers = st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=6).map(
    lambda ws: ", ".join(f"0x{w:08x}" for w in ws)
)


@settings(max_examples=examples(200))
@given(prefixes, st.integers(10_000, 30_000), hexbyte, registers)
def test_sxid_register_line_alone_is_reported_with_unknown_fatality(
    prefix: str, code: int, bus: int, words: str
) -> None:
    event = one(f"{prefix}nvidia-nvswitch5: SXid (PCI:0000:{bus:02x}:00.0): {code}, Data {{{words}}}")
    assert (event.kind, event.code, event.pci) == (Kind.SXID, code, f"0000:{bus:02x}:00.0")
    assert event.extra["fatal"] is None and event.extra["header_missing"] is True
    assert event.severity == "warning"  # unknown fatality never drains a node on its own
    assert event.extra["registers"] == [w.strip() for w in words.split(",")]


@settings(max_examples=examples(100))
@given(st.integers(10_000, 30_000), st.sampled_from(["Fatal", "Non-fatal"]), st.integers(0, 18))
def test_sxid_detail_lines_fold_into_their_header(code: int, word: str, gap: int) -> None:
    head = f"nvidia-nvswitch2: SXid (PCI:0000:c6:00.0): {code}, {word}, Link 44 (0x1 0x2)"
    noise = [f"[{i}.0] unrelated line {i}" for i in range(gap)]
    switch = "nvidia-nvswitch2: SXid (PCI:0000:c6:00.0)"
    severity = f"{switch}: {code}, Severity 1 Engine instance 44 Sub-engine instance 00"
    data = f"nvidia-nvswitch2: SXid (PCI:0000:c6:00.0): {code}, Data {{0x00000001, 0x00000002}}"
    (event,) = parse(head, *noise, severity, data)
    assert (event.code, event.extra["fatal"]) == (code, word == "Fatal")
    # The header lost: the severity line is the event (Severity 1: fatal), its data line folds into it.
    (alone,) = parse(*noise, severity, data)
    assert alone.extra["fatal"] is True and alone.severity == "critical"


@settings(max_examples=examples(200))
@given(prefixes, st.one_of(st.none(), domains), hexbyte, st.integers(0, 31), functions)
def test_fallen_off_the_bus_single_line(prefix: str, domain: int | None, bus: int, dev: int, fn: int) -> None:
    address = (f"{domain:04x}:" if domain is not None else "") + f"{bus:02x}:{dev:02x}.{fn}"
    event = one(f"{prefix}NVRM: GPU {address}: GPU has fallen off the bus.")
    assert (event.kind, event.code, event.action) == (Kind.GPU_FALLEN_OFF_BUS, None, "RESTART_BM")
    assert event.pci == f"{domain or 0:04x}:{bus:02x}:{dev:02x}.{fn}"


@settings(max_examples=examples(200))
@given(prefixes, domains, hexbyte, st.booleans(), st.sampled_from(["", "               "]))
def test_fallen_off_the_bus_three_line_banner(
    prefix: str, domain: int, bus: int, pci_id: bool, indent: str
) -> None:
    lines = [
        f"{prefix}NVRM: The NVIDIA GPU {domain:04x}:{bus:02x}:00.0",
        f"{indent}NVRM: (PCI ID: 10de:2330) installed in this system has"
        if pci_id
        else f"{indent}NVRM: installed in this system has",
        f"{indent}NVRM: fallen off the bus.",
    ]
    (event,) = parse(*lines)
    assert (event.kind, event.pci, event.line) == (Kind.GPU_FALLEN_OFF_BUS, f"{domain:04x}:{bus:02x}:00.0", 1)
    # An Xid 79 for the same GPU printed first absorbs the banner (one incident, one event).
    xid = f"NVRM: Xid (PCI:{domain:04x}:{bus:02x}:00): 79, pid=1, name=x, GPU has fallen off the bus."
    assert [e.kind for e in parse(xid, *lines)] == [Kind.XID]


@settings(max_examples=examples(200))
@given(
    prefixes,
    st.integers(0, 255),
    st.integers(0, 15),
    st.integers(0, 3),
    st.lists(st.integers(0, 2**20), min_size=7, max_size=7),
)
def test_xid_13_and_74_details(prefix: str, gpc: int, tpc: int, sm: int, regs: list[int]) -> None:
    thirteen = one(
        f"{prefix}NVRM: Xid (PCI:0000:9a:00): 13, pid='<unknown>', name=<unknown>, "
        f"Graphics SM Warp Exception on (GPC {gpc}, TPC {tpc}, SM {sm}): Out Of Range Address"
    )
    assert (thirteen.extra["gpc"], thirteen.extra["tpc"], thirteen.extra["sm"]) == (gpc, tpc, sm)
    words = ", ".join(hex(r) for r in regs)
    seventy_four = one(
        f"{prefix}NVRM: Xid (PCI:0002:81:00): 74, pid='<unknown>', name=<unknown>, "
        f"NVLink: fatal error detected on link {gpc % 18}({words})"
    )
    assert seventy_four.extra["link"] == gpc % 18
    assert [int(w, 16) for w in seventy_four.extra["registers"]] == regs
