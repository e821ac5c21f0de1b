"""The fabric watcher on sysfs trees another process writes (tests/fabric_tree.py), NVML through FakeNvml.

Issue #35 items 1-3: a counter crossing its threshold is an event at the next poll (two-poll target),
the counter histories survive an agent restart (a counter that rose while the agent was down is
judged), a reset is a new baseline, a PCIe link that loses lanes or an IB port below its profile's rate
is reported with how much, a RoCE pause storm is congestion, and every check that cannot be made is a
skipped check with its reason -- never a pass, never a crash.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ftd.agent.conditions import ConditionBook
from ftd.agent.watchers.fabric import FabricWatcher
from ftd.agent.watchers.fabric.sysfs import nearest_gpus, read_ports
from ftd.agent.watchers.fabric.watcher import Snapshot
from ftd.agent.watchers.nvml.backend import PcieLinkInfo
from ftd.agent.watchers.nvml.fake import FakeNvml
from ftd.config.schema import FabricConfig, HardwareConfig
from ftd.events import Event, Kind
from tests.agent_on_bus import agent_on_bus
from tests.fabric_tree import GPU, IB_NIC, PCI_PATHS, TreeWriter, counter, fake_ethtool, node_tree


def _nvml(pci: str = GPU, name: str = "NVIDIA H100 80GB HBM3") -> FakeNvml:
    nvml = FakeNvml(count=1)
    nvml.gpus[0].pci, nvml.gpus[0].name = pci, name
    nvml.gpus[0].with_nvlink(18)
    return nvml


class Rig:
    def __init__(self, tmp: Path, *, profile: str = "", nvml: FakeNvml | None = None) -> None:
        self.root = tmp / "root"
        self.root.mkdir()
        self.stats = tmp / "stats"
        self.ethtool = fake_ethtool(tmp / "ethtool", self.stats)
        self.state = tmp / "state" / "fabric.json"
        self.writer = TreeWriter(self.root)
        node_tree(self.writer)
        self.nvml = nvml if nvml is not None else _nvml()
        self.profile = profile
        self.book = ConditionBook(tmp / "conditions.json", boot="boot-1")

    def watcher(self, **cfg: object) -> FabricWatcher:
        config = FabricConfig(**{"ethtool": str(self.ethtool), **cfg})  # type: ignore[arg-type]
        return FabricWatcher(
            config,
            "gpu-a01",
            _no_emit,
            hardware=HardwareConfig(profile=self.profile),
            state_path=self.state,
            root=self.root,
            backend=self.nvml,
        )

    def poll(self, watcher: FabricWatcher, now: float) -> list[Event]:
        events = watcher.check(watcher.read(), now)
        for event in events:
            self.book.observe(event)
        return events


async def _no_emit(event: Event) -> None:
    return None


@pytest.fixture
def rig(tmp_path: Path):  # type: ignore[no-untyped-def]
    r = Rig(tmp_path)
    yield r
    r.writer.close()


def _counter_events(events: list[Event]) -> list[Event]:
    return [e for e in events if e.kind == Kind.FABRIC and e.data["check"] == "counter"]


def test_ports_netdevs_and_gpu_locality_from_the_tree(rig: Rig) -> None:
    ports = {p.name: p for p in read_ports(rig.root)}
    ib, roce = ports["mlx5_0/1"], ports["mlx5_1/1"]
    assert (ib.link_layer, ib.state, ib.phys_state, ib.rate) == (
        "InfiniBand",
        "ACTIVE",
        "LinkUp",
        "400 Gb/sec (4X NDR)",
    )
    assert (ib.bdf, ib.netdevs, roce.netdevs) == (IB_NIC, ["ibp23s0"], ["enp90s0"])
    assert ib.counters["symbol_error"] == 0 and ib.hw_counters["out_of_buffer"] == 0
    assert nearest_gpus(rig.root, IB_NIC, [GPU]) == ([GPU], "switch")
    assert nearest_gpus(rig.root, roce.bdf or "", [GPU]) == ([GPU], "host_bridge")
    watcher = rig.watcher()
    rig.poll(watcher, 0.0)
    assert watcher.port_map["mlx5_0/1"] == {
        "netdevs": ["ibp23s0"], "pci": IB_NIC, "gpus": [GPU], "gpu_locality": "switch",
        "link_layer": "InfiniBand", "state": "ACTIVE", "rate": "400 Gb/sec (4X NDR)",
    }  # fmt: skip


def test_symbol_errors_over_the_limit_are_fatal_at_the_next_poll_and_clear_after_a_quiet_hour(
    rig: Rig,
) -> None:
    watcher = rig.watcher()
    assert _counter_events(rig.poll(watcher, 1000.0)) == []  # the baseline
    assert watcher.profile == "h100-sxm"  # matched from NVML's GPU name
    rig.writer.write({counter("symbol_error"): "100\n"})
    assert _counter_events(rig.poll(watcher, 1030.0)) == []  # 100 in the hour: under 120
    rig.writer.write({counter("symbol_error"): "130\n"})
    (event,) = _counter_events(rig.poll(watcher, 1060.0))  # the poll after the crossing
    assert event.severity == "critical"
    data = event.data
    assert (data["counter"], data["device"], data["port"], data["class"], data["status"]) == (
        "symbol_error", "mlx5_0", 1, "fatal", "crossed")  # fmt: skip
    assert data["per_hour"] == 130 and data["delta"] == 30 and data["per_s"] == 1.0
    assert data["threshold"] == "over 120/h" and data["profile"] == "h100-sxm"
    assert data["gpus"] == [GPU] and data["netdevs"] == ["ibp23s0"]
    (cond,) = rig.book.active()
    assert cond.key == "fabric:ib:mlx5_0/1:symbol_error" and "symbol_error on mlx5_0" in cond.reason
    assert _counter_events(rig.poll(watcher, 1090.0)) == []  # still over: reported once
    (cleared,) = _counter_events(rig.poll(watcher, 1060.0 + 3700.0))  # an hour without a new error
    assert (cleared.severity, cleared.data["status"]) == ("info", "cleared")
    assert rig.book.active() == []


def test_link_downed_is_fatal_on_any_increase(rig: Rig) -> None:
    watcher = rig.watcher()
    rig.poll(watcher, 0.0)
    rig.writer.write({counter("link_downed"): "1\n"})
    (event,) = _counter_events(rig.poll(watcher, 30.0))
    assert (event.data["counter"], event.data["crossed"], event.severity) == (
        "link_downed",
        "any increase",
        "critical",
    )


def test_state_survives_a_restart_and_what_rose_meanwhile_is_judged(rig: Rig) -> None:
    first = rig.watcher()
    rig.poll(first, 0.0)
    assert rig.state.exists()
    rig.writer.write({counter("symbol_error"): "150\n"})  # while the agent is down
    # A watcher without the saved state would take 150 as its baseline and see nothing:
    fresh = Rig.watcher(rig)
    fresh.state_path = None
    fresh.state.counters.clear()
    assert _counter_events(fresh.check(fresh.read(), 1800.0)) == []
    restarted = rig.watcher()  # reads fabric.json
    (event,) = _counter_events(rig.poll(restarted, 1800.0))
    assert event.data["per_hour"] == 150 and event.data["span_s"] == 1800.0
    # and the condition it opened is cleared by the next agent, after its own restart
    again = rig.watcher()
    (cleared,) = _counter_events(rig.poll(again, 1800.0 + 3700.0))
    assert cleared.data["status"] == "cleared"


def test_a_counter_that_goes_down_is_a_new_baseline(rig: Rig) -> None:
    watcher = rig.watcher()
    rig.writer.write({counter("port_rcv_errors"): "5000\n"})
    rig.poll(watcher, 0.0)
    rig.writer.write({counter("port_rcv_errors"): "3\n"})  # reset (driver reload / perfquery -R)
    assert _counter_events(rig.poll(watcher, 30.0)) == []
    rig.writer.write({counter("port_rcv_errors"): "150\n"})  # 147 since the reset: over 100/h
    (event,) = _counter_events(rig.poll(watcher, 60.0))
    assert event.data["per_hour"] == 147 and event.severity == "warning"


def test_a_pcie_link_that_loses_lanes_says_how_much_and_recovers(rig: Rig) -> None:
    watcher = rig.watcher()
    assert [e for e in rig.poll(watcher, 0.0) if e.kind == Kind.PCIE_LINK] == []
    gpu_dir = f"sys/devices/{PCI_PATHS[GPU]}"
    rig.writer.write({f"{gpu_dir}/current_link_speed": "2.5 GT/s PCIe\n"})  # an idle GPU: not judged
    assert [e for e in rig.poll(watcher, 30.0) if e.kind == Kind.PCIE_LINK] == []
    rig.writer.write(
        {f"{gpu_dir}/current_link_width": "8\n", f"{gpu_dir}/current_link_speed": "32.0 GT/s PCIe\n"}
    )
    (event,) = [e for e in rig.poll(watcher, 60.0) if e.kind == Kind.PCIE_LINK]
    assert event.severity == "warning"
    assert {k: event.data[k] for k in ("pci", "device", "cur_width", "max_width", "lanes_lost",
                                        "bandwidth_pct", "what", "status", "from")} == {
        "pci": GPU, "device": "gpu0", "cur_width": 8, "max_width": 16, "lanes_lost": 8,
        "bandwidth_pct": 50.0, "what": "width", "status": "degraded", "from": "sysfs"}  # fmt: skip
    nic_dir = f"sys/devices/{PCI_PATHS[IB_NIC]}"
    rig.writer.write({f"{nic_dir}/current_link_speed": "16.0 GT/s PCIe\n"})  # a NIC's speed is judged
    (nic,) = [e for e in rig.poll(watcher, 90.0) if e.kind == Kind.PCIE_LINK]
    assert (nic.data["device"], nic.data["what"], nic.data["gens_lost"]) == ("nic mlx5_0", "speed", 1)
    rig.writer.write({f"{gpu_dir}/current_link_width": "16\n"})
    (back,) = [e for e in rig.poll(watcher, 120.0) if e.kind == Kind.PCIE_LINK]
    assert (back.severity, back.data["status"], back.data["pci"]) == ("info", "recovered", GPU)


def test_nvml_gives_the_link_where_sysfs_has_none(tmp_path: Path) -> None:
    nvml = _nvml(pci="0000:c1:00.0")  # a GPU whose sysfs function is not in the tree (a container)
    nvml.gpus[0].pcie = PcieLinkInfo(5, 5, 4, 16)
    r = Rig(tmp_path, nvml=nvml)
    try:
        (event,) = [e for e in r.poll(r.watcher(), 0.0) if e.kind == Kind.PCIE_LINK]
        assert (event.data["from"], event.data["cur_width"], event.data["lanes_lost"]) == ("nvml", 4, 12)
        assert event.data["bandwidth_pct"] == 25.0
    finally:
        r.writer.close()


def test_port_below_its_profile_rate(rig: Rig) -> None:
    watcher = rig.watcher()
    rig.poll(watcher, 0.0)
    rig.writer.write({"sys/class/infiniband/mlx5_0/ports/1/rate": "200 Gb/sec (4X HDR)\n"})
    (event,) = [e for e in rig.poll(watcher, 30.0) if e.data.get("check") == "port_rate"]
    assert (event.data["rate_gbps"], event.data["expected_gbps"], event.data["pct"]) == (200.0, 400.0, 50.0)
    assert event.data["speed"] == "HDR" and event.severity == "warning"


def test_a_pause_storm_is_congestion(rig: Rig) -> None:
    (rig.stats.parent / "stats.enp90s0").write_text(
        "     rx_pause_ctrl_phy: 0\n     rx_packets: 5\n     rx_prio3_pause: 0\n     rx_prio3_packets: 9\n"
    )
    watcher = rig.watcher()
    rig.poll(watcher, 0.0)
    (rig.stats.parent / "stats.enp90s0").write_text("     rx_pause_ctrl_phy: 900000\n")
    (event,) = _counter_events(rig.poll(watcher, 30.0))
    assert (event.data["source"], event.data["counter"], event.data["class"]) == (
        "phy",
        "rx_pause_ctrl_phy",
        "congestion",
    )
    assert (
        event.data["per_s"] == 30000.0 and event.data["netdev"] == "enp90s0" and event.severity == "warning"
    )
    assert rig.book.active() == []  # congestion is no node condition
    read = watcher.read()
    assert read.phy["enp90s0"] == ({"rx_pause_ctrl_phy": 900000}, "")  # the file now holds only that
    (rig.stats.parent / "stats.enp90s0").write_text("     rx_prio3_pause: 4\n     rx_prio3_packets: 9\n")
    assert watcher.read().phy["enp90s0"] == ({"rx_prio3_pause": 4}, "")  # PFC per priority, not packets


def test_nvlink_errors_from_nvml_as_rates(rig: Rig) -> None:
    watcher = rig.watcher()
    rig.poll(watcher, 0.0)
    assert rig.nvml.gpus[0].nvlink is not None
    rig.nvml.gpus[0].nvlink["recovery"] = 11
    (event,) = _counter_events(rig.poll(watcher, 30.0))
    assert (event.data["source"], event.data["counter"], event.data["pci"], event.data["per_hour"]) == (
        "nvlink", "recovery", GPU, 11)  # fmt: skip


def _skips(events: list[Event]) -> dict[str, str]:
    return {e.data["what"]: e.data["reason"] for e in events if e.data.get("check") == "skipped"}


def test_unknown_profile_skips_the_thresholds_with_its_reason(tmp_path: Path) -> None:
    r = Rig(tmp_path, nvml=_nvml(name="NVIDIA GeForce RTX 4090"))
    try:
        watcher = r.watcher()
        skips = _skips(r.poll(watcher, 0.0))
        assert skips["thresholds"] == "no hardware profile matches GPU 'NVIDIA GeForce RTX 4090'"
        r.writer.write({counter("link_downed"): "9\n"})
        events = r.poll(watcher, 30.0)
        assert _counter_events(events) == [] and _skips(events) == {}  # said once, not again
        assert watcher.skipped["thresholds"].startswith("no hardware profile")
        assert [e for e in events if e.kind == Kind.PCIE_LINK] == []  # links are judged without one
    finally:
        r.writer.close()


def test_configured_profile_not_in_the_catalog(tmp_path: Path) -> None:
    r = Rig(tmp_path, profile="b300-nvl")
    try:
        skips = _skips(r.poll(r.watcher(), 0.0))
        assert skips["thresholds"] == "hardware.profile 'b300-nvl' is not in the catalog"
    finally:
        r.writer.close()


def test_missing_and_unreadable_counters_and_no_ethtool_are_skipped_with_reasons(rig: Rig) -> None:
    rig.writer.remove(counter("symbol_error"))
    rig.writer.remove(counter("link_downed"))
    rig.writer.mkdir(counter("link_downed"))  # a directory where the file should be: unreadable
    watcher = rig.watcher(ethtool=str(rig.root / "no-such-ethtool"))
    skips = _skips(rig.poll(watcher, 0.0))
    assert "symbol_error: no such counter" in skips["ib:mlx5_0/1"]
    assert "link_downed: Is a directory" in skips["ib:mlx5_0/1"], skips
    assert skips["phy:mlx5_1/1:enp90s0"].endswith("no-such-ethtool not found")
    assert skips["phy:mlx5_0/1"].startswith("link layer InfiniBand")
    # the counters that are there are still judged
    rig.writer.write({counter("local_link_integrity_errors"): "1\n"})
    (event,) = _counter_events(rig.poll(watcher, 30.0))
    assert event.data["counter"] == "local_link_integrity_errors"


def test_ethtool_without_phy_counters_is_skipped(rig: Rig) -> None:
    watcher = rig.watcher()
    skips = _skips(rig.poll(watcher, 0.0))  # no stats file: the stand-in exits 94 like ethtool
    assert "exited 94: Cannot get stats information" in skips["phy:mlx5_1/1:enp90s0"]
    (rig.stats.parent / "stats.enp90s0").write_text("     rx_packets: 5\n")
    skips = _skips(rig.poll(watcher, 30.0))
    assert skips["phy:mlx5_1/1:enp90s0"].endswith("reports no *_phy counter (driver without them)")


def test_nvml_unavailable_is_a_skip_and_the_rest_is_still_read(tmp_path: Path) -> None:
    r = Rig(tmp_path, profile="h200-sxm", nvml=FakeNvml(count=1, unavailable="NVML Shared Library Not Found"))
    try:
        watcher = r.watcher()
        skips = _skips(r.poll(watcher, 0.0))
        assert skips["nvml"] == "NVML unavailable: NVML Shared Library Not Found"
        assert "thresholds" not in skips  # the configured profile needs no GPU name
        r.writer.write({counter("symbol_error"): "500\n"})
        assert len(_counter_events(r.poll(watcher, 30.0))) == 1
    finally:
        r.writer.close()


def test_an_empty_node_is_idle_and_a_corrupt_state_file_is_no_crash(tmp_path: Path) -> None:
    state = tmp_path / "fabric.json"
    state.write_text("{not json")
    watcher = FabricWatcher(FabricConfig(), "n", _no_emit, state_path=state, root=tmp_path / "empty")
    events = watcher.check(watcher.read(), 0.0)
    assert watcher.health().state == "idle"
    assert events == []  # nothing to check: the skips are logged and kept, not sent
    assert watcher.skipped["thresholds"].startswith("no hardware profile")
    assert watcher.skipped["nvml"].startswith("NVML not used")


def test_the_loop_emits_within_two_polls(rig: Rig) -> None:
    got: list[Event] = []

    async def main() -> None:
        crossed = asyncio.Event()
        polled = asyncio.Event()

        async def emit(event: Event) -> None:
            got.append(event)
            if event.data.get("check") == "counter":
                crossed.set()

        watcher = FabricWatcher(
            FabricConfig(ethtool=str(rig.ethtool), interval_s=1.0),
            "gpu-a01",
            emit,
            hardware=HardwareConfig(profile="h200-sxm"),
            state_path=rig.state,
            root=rig.root,
            backend=rig.nvml,
        )
        check = watcher.check

        def counted(snap: Snapshot, now: float) -> list[Event]:
            polled.set()
            return check(snap, now)

        watcher.check = counted  # type: ignore[method-assign]
        task = asyncio.create_task(watcher.run())
        try:
            async with asyncio.timeout(30):
                await polled.wait()
                polls = watcher.polls
                rig.writer.write({counter("excessive_buffer_overrun_errors"): "1\n"})
                await crossed.wait()
            assert watcher.polls <= polls + 2
        finally:
            task.cancel()

    asyncio.run(main())
    (event,) = _counter_events(got)
    assert event.data["counter"] == "excessive_buffer_overrun_errors"


def test_a_saturated_counter_is_skipped_not_read_as_quiet(rig: Rig) -> None:
    watcher = rig.watcher()
    rig.poll(watcher, 0.0)
    rig.writer.write({counter("symbol_error"): "65535\n"})  # 16 bits: stopped at its maximum
    events = rig.poll(watcher, 30.0)
    (crossed,) = _counter_events(events)  # the climb to the maximum is still judged
    assert crossed.data["counter"] == "symbol_error"
    assert _skips(events)["saturated:ib:mlx5_0/1:symbol_error"].startswith("symbol_error saturated at 65535")
    assert rig.poll(watcher, 60.0) == []
    assert _counter_events(rig.poll(watcher, 60.0 + 3700.0)) == []  # never "cleared" by a stopped counter
    assert [c.key for c in rig.book.active()] == ["fabric:ib:mlx5_0/1:symbol_error"]


def test_a_read_that_hangs_is_a_skipped_check_and_the_loop_goes_on(rig: Rig) -> None:
    rig.nvml.block_global.add("device_count")  # NVML stuck on a sick GPU

    async def main() -> None:
        got: list[Event] = []

        async def emit(event: Event) -> None:
            got.append(event)

        watcher = FabricWatcher(
            FabricConfig(ethtool=str(rig.ethtool), read_timeout_s=0.2),
            "gpu-a01",
            emit,
            hardware=HardwareConfig(profile="h100-sxm"),
            root=rig.root,
            backend=rig.nvml,
        )
        first = await watcher.poll_once()
        assert _skips(first) == {"read": "reading the fabric took over 0.2 s"}
        await watcher.poll_once()
        assert watcher.skipped["read"] == "the previous read has not returned after 0.2 s"
        rig.nvml.release()
        async with asyncio.timeout(30):
            while watcher._reading:  # noqa: ASYNC110 - the stuck read's thread, not a loop task
                await asyncio.sleep(0.05)
        await watcher.poll_once()
        assert "read" not in watcher.skipped and watcher.polls == 1
        assert [e.data["what"] for e in got if e.data.get("check") == "skipped"][:2] == ["read", "read"]

    asyncio.run(main())


def test_the_agent_publishes_a_fatal_counter_keeps_the_condition_and_remembers_across_a_restart(
    rig: Rig, tmp_path: Path
) -> None:
    """The whole agent (build_agent): the fabric watcher's event leaves through the door onto the bus,
    the node's condition book holds it (what `ftd health` answers Slurm), and a second agent on the
    same state dir judges what rose while none ran."""
    from ftd.config import AgentConfig
    from tests.unit.helpers import until

    kmsg = tmp_path / "kmsg"
    kmsg.touch()
    cfg = AgentConfig(
        node="n1",
        kmsg_path=str(kmsg),
        state_dir=str(tmp_path / "s"),
        socket_path=str(tmp_path / "a.sock"),
        fabric=FabricConfig(root=str(rig.root), ethtool=str(rig.ethtool), interval_s=1.0),
    )

    def crossed(got: list[Event], name: str) -> list[Event]:
        return [
            e for e in _counter_events(got) if e.data["counter"] == name and e.data["status"] == "crossed"
        ]

    async def one_agent(change: str | None, wanted: str) -> tuple[list[Event], list[str]]:
        build = {"nvml_backend": rig.nvml, "hardware": HardwareConfig(profile="h100-sxm")}
        async with agent_on_bus(cfg, [Kind.FABRIC], **build) as running:
            await until(lambda: rig.state.parent.parent.joinpath("s", "fabric.json").exists(), within=20)
            if change is not None:
                rig.writer.write({counter("symbol_error"): change})
            await until(lambda: bool(crossed(running.events, wanted)), within=20)
            conditions = [c.key for c in running.agent.conditions.active()]
            return running.events, conditions

    got, conditions = asyncio.run(one_agent("200\n", "symbol_error"))
    (event,) = crossed(got, "symbol_error")
    assert (event.severity, event.data["counter"], event.node) == ("critical", "symbol_error", "n1")
    assert conditions == ["fabric:ib:mlx5_0/1:symbol_error"]
    first_id = event.id
    # The agent stops; the port's link goes down meanwhile; the next agent judges it at its first read.
    rig.writer.write({counter("link_downed"): "1\n"})
    got, conditions = asyncio.run(one_agent(None, "link_downed"))
    (event,) = crossed(got, "link_downed")
    assert event.data["delta"] == 1
    # symbol_error was open before the restart: not reported open again (an event the first agent's
    # spool resends is the same event, same id)
    assert {e.id for e in crossed(got, "symbol_error")} <= {first_id}
    assert conditions == ["fabric:ib:mlx5_0/1:symbol_error", "fabric:ib:mlx5_0/1:link_downed"]


def test_a_two_port_device_maps_each_port_to_its_own_network_device(rig: Rig) -> None:
    base = "sys/class/infiniband/mlx5_0/ports/2"
    nic = f"sys/devices/{PCI_PATHS[IB_NIC]}"
    rig.writer.write(
        {
            f"{base}/state": "1: DOWN\n",
            f"{base}/phys_state": "3: Disabled\n",
            f"{base}/link_layer": "InfiniBand\n",
            f"{base}/rate": "10 Gb/sec (4X SDR)\n",
            f"{nic}/net/ibp23s0d1/dev_port": "1\n",
        }
    )
    ports = {p.name: p for p in read_ports(rig.root)}
    assert (ports["mlx5_0/1"].netdevs, ports["mlx5_0/2"].netdevs) == (["ibp23s0"], ["ibp23s0d1"])
    assert ports["mlx5_0/2"].counters == {} and ports["mlx5_0/2"].problems["ib:*"] == "no counters/ directory"
    watcher = rig.watcher()
    skips = _skips(rig.poll(watcher, 0.0))
    assert skips["ib:mlx5_0/2"] == "no counters/ directory"
    assert "port_rate:mlx5_0/2" not in skips  # a port that is down is the host watcher's ib_link
    assert [e for e in rig.poll(watcher, 30.0) if e.data.get("check") == "port_rate"] == []


def test_after_a_reboot_the_conditions_are_forgotten_and_a_bad_link_is_reported_again(rig: Rig) -> None:
    def watcher(boot: str) -> FabricWatcher:
        return FabricWatcher(
            FabricConfig(ethtool=str(rig.ethtool)),
            "gpu-a01",
            _no_emit,
            hardware=HardwareConfig(profile="h100-sxm"),
            state_path=rig.state,
            root=rig.root,
            backend=rig.nvml,
            boot=boot,
        )

    before = watcher("boot-1")
    rig.poll(before, 0.0)
    rig.writer.write({counter("local_link_integrity_errors"): "1\n"})
    assert len(_counter_events(rig.poll(before, 30.0))) == 1
    same_boot = watcher("boot-1")
    assert "ib:mlx5_0/1:local_link_integrity_errors" in same_boot.state.open  # an agent restart keeps it
    # The reboot: counters back to 0, and the port counts one link_downed as it trains (0 -> 1: judged
    # against the last boot's 0 it would be a fatal increase).
    rig.writer.write({counter("local_link_integrity_errors"): "0\n", counter("link_downed"): "1\n"})
    after = watcher("boot-2")
    assert after.state.open == {} and after.state.counters == {}
    assert _counter_events(rig.poll(after, 600.0)) == []  # not judged against the last boot's values
    rig.writer.write({counter("link_downed"): "2\n"})  # still flapping after the reboot
    (event,) = _counter_events(rig.poll(after, 630.0))
    assert (event.data["counter"], event.data["status"]) == ("link_downed", "crossed")
