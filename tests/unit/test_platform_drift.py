"""Issue #36's pure judgement: version order (properties), NCCL's init line, drift between the nodes of
one hardware profile and against the minimums, every unknown fact kept unknown (never a pass)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ftd.catalog.hardware_profiles import load_hardware_catalog
from ftd.platform.drift import NodeFacts, find_drift
from ftd.platform.inventory import COMPARED, Fact, Inventory, inventory_from_data, known, unknown
from ftd.platform.nccl_version import nccl_version
from ftd.platform.versions import at_least, version_key
from tests.properties import examples

# --- versions ------------------------------------------------------------------------------------------


def test_versions_order_as_operators_read_them() -> None:
    assert version_key("535.104.05") < version_key("550.54.15")
    assert version_key("535.104.05") < version_key("535.104.12")
    assert version_key("535.54.03") < version_key("535.104.05")  # numbers, not text ("54" < "104")
    assert version_key("96.00.89.00.01") < version_key("96.00.99.00.01")
    assert version_key("2.21.5+cuda12.4") == version_key("2.21.5+cuda12.2")  # the build tag is no part
    assert version_key("2.18.3") < version_key("2.21.5+cuda12.4")
    assert version_key("1.0") == version_key("1.0.0")
    assert version_key("MLNX_OFED_LINUX-23.10-1.1.9.0") > version_key("MLNX_OFED_LINUX-5.8-3.0.7.0")
    assert version_key("5.15.0-91-generic") < version_key("5.15.0-101-generic")
    assert at_least("535.104.05", "535.104.05") is True
    assert at_least("525.60.13", "535.104.05") is False
    assert at_least("N/A", "535.104.05") is None  # not a version: cannot tell, never a pass


parts = st.lists(st.integers(0, 10**6), min_size=1, max_size=6)


@settings(max_examples=examples(300))
@given(parts, parts)
def test_numeric_versions_order_like_their_numbers(a: list[int], b: list[int]) -> None:
    def strip(p: list[int]) -> list[int]:
        while p and p[-1] == 0:
            p = p[:-1]
        return p

    sa, sb = ".".join(map(str, a)), ".".join(map(str, b))
    assert (version_key(sa) < version_key(sb)) == (strip(a) < strip(b))
    assert (version_key(sa) == version_key(sb)) == (strip(a) == strip(b))


@settings(max_examples=examples(300))
@given(st.text(max_size=80), st.text(max_size=80), st.text(max_size=80))
def test_any_text_orders_totally_and_never_raises(a: str, b: str, c: str) -> None:
    ka, kb, kc = version_key(a), version_key(b), version_key(c)
    assert (ka <= kb) or (kb <= ka)
    if ka <= kb and kb <= kc:
        assert ka <= kc
    result = at_least(a, b)
    assert result is None or isinstance(result, bool)


# --- NCCL's init line ----------------------------------------------------------------------------------


def test_nccl_version_from_its_init_line_whatever_the_prefix() -> None:
    assert nccl_version("node-3:12345:12345 [0] NCCL INFO NCCL version 2.21.5+cuda12.4") == "2.21.5+cuda12.4"
    assert (
        nccl_version("[node-3 rank 5] gpu-h:1:1 [5] NCCL INFO NCCL version 2.18.3+cuda12.2")
        == "2.18.3+cuda12.2"
    )
    assert nccl_version("NCCL version 2.19.3") == "2.19.3"
    assert nccl_version("NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>") is None
    assert nccl_version("NCCL version unknown") is None


@settings(max_examples=examples(300))
@given(st.text(max_size=200), st.text(max_size=40))
def test_nccl_version_never_raises(prefix: str, tail: str) -> None:
    found = nccl_version(prefix + "NCCL version " + tail)
    assert found is None or (found[0].isdigit() and len(found) <= 64)


# --- the wire shape ------------------------------------------------------------------------------------


def test_inventory_round_trips_and_rejects_bad_input() -> None:
    inv = Inventory(driver=known("550.54.15"), ofed=unknown("ofed_info not found"))
    back = inventory_from_data(inv.to_data())
    assert back == inv
    assert back is not None and back.ofed.text() == "unknown (ofed_info not found)"
    assert back.kernel.text() == "unknown (not reported)"  # absent is unknown, never empty-and-equal
    bad: object
    for bad in (
        None,
        [],
        {"driver": 5},
        {"driver": {"value": "x" * 10_000}},
        {"gpus": "no"},
        {"gpus": [{"index": 0, "serial": {"value": "s" * 300}}]},
        {"nics": [{"device": "d" * 300}]},
    ):
        assert inventory_from_data(bad) is None


# --- drift ---------------------------------------------------------------------------------------------

CATALOG = load_hardware_catalog()


def minimums(profile: str) -> Mapping[str, Any] | None:
    return CATALOG.section("versions", profile)


def node(profile: str = "h100-sxm", **over: str | Fact) -> NodeFacts:
    facts: dict[str, Fact] = {
        "driver": known("550.54.15"),
        "cuda": known("12.4"),
        "vbios": known("96.00.89.00.01"),
        "nic_firmware": known("28.39.1002"),
        "ofed": known("MLNX_OFED_LINUX-23.10-1.1.9.0"),
        "nccl": unknown("no job on this node has printed NCCL's version yet"),
        "kernel": known("5.15.0-91-generic"),
        "os": known("Ubuntu 22.04.3 LTS"),
    }
    for key, value in over.items():
        facts[key] = value if isinstance(value, Fact) else known(value)
    return NodeFacts(profile=known(profile), facts=facts)


def cluster(n: int = 16, /, **odd: NodeFacts) -> dict[str, NodeFacts]:
    nodes = {f"node-{i:02d}": node() for i in range(n)}
    nodes.update(odd)
    return nodes


def test_sixteen_identical_nodes_have_no_drift() -> None:
    reports = find_drift(cluster(), minimums)
    assert len(reports) == 16
    assert all(not r.drift for r in reports.values())
    assert all(r.unknown == ("nccl",) for r in reports.values())  # unknown is listed, not passed


def test_one_driver_or_vbios_in_sixteen_is_named() -> None:
    nodes = cluster(**{"node-07": node(driver="535.104.05"), "node-11": node(vbios="96.00.74.00.1C")})
    reports = find_drift(nodes, minimums)
    assert {n for n, r in reports.items() if r.drift} == {"node-07", "node-11"}
    assert reports["node-07"].fields == ("driver",)
    assert (
        "535.104.05 differs from its h100-sxm peers (15 of 16 run 550.54.15)" in reports["node-07"].summary()
    )
    assert reports["node-11"].fields == ("vbios",)


def test_a_split_profile_has_no_majority_to_trust() -> None:
    nodes = {f"a{i}": node() for i in range(8)} | {f"b{i}": node(kernel="6.5.0-1") for i in range(8)}
    reports = find_drift(nodes, minimums)
    assert all(r.fields == ("kernel",) for r in reports.values())
    assert "split" in reports["a0"].summary()


def test_minimums_and_unknown_facts_fail_closed() -> None:
    nodes = cluster(
        **{
            "old": node(driver="520.61.05"),
            "blind": node(driver=unknown("NVML unavailable: driver not loaded")),
        }
    )
    reports = find_drift(nodes, minimums)
    assert reports["old"].fields == ("driver",)
    assert any("below the minimum 525.60.13" in d.why for d in reports["old"].drift)
    blind = reports["blind"]
    assert blind.fields == ("driver",) and "is not checked" in blind.summary()  # never a pass
    assert "driver" in blind.unknown


def test_no_profile_is_not_judged_and_says_why() -> None:
    nodes = cluster(odd=NodeFacts(profile=unknown("no single hardware profile matches the GPU names X")))
    report = find_drift(nodes, minimums)["odd"]
    assert not report.drift and report.unchecked.startswith("no hardware profile")


def test_profiles_are_judged_apart_and_too_few_peers_are_not_compared() -> None:
    nodes = cluster(4) | {"l40s-1": node("l40s", driver="535.104.05"), "l40s-2": node("l40s")}
    reports = find_drift(nodes, minimums)
    assert not reports["l40s-1"].drift and not reports["l40s-2"].drift  # 2 < min_peers: no peer verdict
    assert find_drift(nodes, minimums, min_peers=2)["l40s-1"].fields == ("driver",)  # split 1:1


def test_fields_choose_what_is_compared_with_peers() -> None:
    nodes = cluster(odd=node(nccl="2.18.3"))
    nodes |= {f"n{i}": node(nccl="2.21.5+cuda12.4") for i in range(5)}
    assert not find_drift(nodes, minimums, fields=("driver",))["odd"].drift
    assert find_drift(nodes, minimums, fields=COMPARED)["odd"].fields == ("nccl",)


@settings(max_examples=examples(100))
@given(st.lists(st.sampled_from(["550.54.15", "535.104.05", "N/A", ""]), min_size=1, max_size=20))
def test_drift_never_raises_and_a_majority_value_never_drifts(drivers: list[str]) -> None:
    nodes = {f"n{i}": node(driver=d if d else unknown("x")) for i, d in enumerate(drivers)}
    reports = find_drift(nodes, minimums, min_peers=2)
    assert set(reports) == set(nodes)
    known_values = [d for d in drivers if d]
    for name, report in reports.items():
        value = nodes[name].facts["driver"]
        peer = [d for d in report.drift if "peers" in d.why]
        if value.known and known_values.count(value.value) * 2 > len(known_values):
            assert not peer


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
fact_like = st.fixed_dictionaries({}, optional={"value": json_values | st.text(), "unknown": json_values})


@settings(max_examples=examples(300))
@given(
    st.dictionaries(st.sampled_from(["driver", "vbios", "gpus", "nics", "os", "x"]), json_values | fact_like)
)
def test_any_data_is_an_inventory_or_none_never_a_crash(data: dict[str, Any]) -> None:
    inv = inventory_from_data(data)
    if inv is not None:
        for fact in inv.facts().values():
            assert fact.known or fact.text().startswith("unknown (")
        assert inventory_from_data(inv.to_data()) == inv
