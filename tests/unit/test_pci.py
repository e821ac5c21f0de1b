"""PCI address normalisation: every spelling the kernel and NVML use, one canonical output."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ftd.pci import normalize_pci

CANONICAL = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


@pytest.mark.parametrize(
    ("raw", "norm"),
    [
        ("0000:3b:00", "0000:3b:00.0"),
        ("3b:00.0", "0000:3b:00.0"),
        ("PCI:0000:3B:00.1", "0000:3b:00.1"),
        ("00000000:3B:00.0", "0000:3b:00.0"),  # NVML's busId: 8-digit domain, upper case
        (b"00000001:C1:00.0", "0001:c1:00.0"),  # ... as pynvml may hand it over
        (" 0000:3b:00.0\n", "0000:3b:00.0"),
        ("10000:01:00.0", "10000:01:00.0"),  # a wider domain (VMD) keeps its digits
        ("zz:00.0", None),
        ("0000:3b:00.8", None),
        ("", None),
        (b"", None),
        (None, None),
    ],
)
def test_normalize_pci(raw: str | bytes | None, norm: str | None) -> None:
    assert normalize_pci(raw) == norm


@given(
    domain=st.integers(0, 0xFFFF), bus=st.integers(0, 255), dev=st.integers(0, 31), fn=st.integers(0, 7),
    upper=st.booleans(), with_domain=st.booleans(), with_fn=st.booleans(), nvml_width=st.booleans(),
    as_bytes=st.booleans(), pci_prefix=st.booleans(),
)  # fmt: skip
def test_every_spelling_gives_the_canonical_form(
    domain: int,
    bus: int,
    dev: int,
    fn: int,
    upper: bool,
    with_domain: bool,
    with_fn: bool,
    nvml_width: bool,
    as_bytes: bool,
    pci_prefix: bool,
) -> None:
    canonical = f"{domain if with_domain else 0:04x}:{bus:02x}:{dev:02x}.{fn if with_fn else 0}"
    width = 8 if nvml_width else 4
    text = (f"{domain:0{width}x}:" if with_domain else "") + f"{bus:02x}:{dev:02x}"
    text = ("PCI:" if pci_prefix else "") + text + (f".{fn}" if with_fn else "")
    text = text.upper() if upper else text
    assert normalize_pci(text.encode() if as_bytes else text) == canonical
    assert normalize_pci(canonical) == canonical


@given(st.one_of(st.text(max_size=24), st.from_regex(r"[0-9a-fA-F:.PCI ]{0,20}", fullmatch=True)))
def test_idempotent_and_canonical_shape(text: str) -> None:
    once = normalize_pci(text)
    assert once is None or CANONICAL.fullmatch(once), once
    assert normalize_pci(once) == once
    assert normalize_pci(text.encode()) == once
