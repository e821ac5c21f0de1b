"""The inventory reporter: this node's :class:`~ftd.platform.inventory.Inventory` at start and on change.

What: :class:`InventoryReporter` reads the node's facts (:mod:`ftd.agent.inventory.read`) off the
event loop every ``interval_s`` and emits a ``Kind.INVENTORY`` event (severity ``info``, source
``inventory``, data the inventory) the first time and whenever any fact changed -- a driver upgraded
under a running agent, a NIC flashed, an NVML that came back. NCCL is the version *the job runs*:
:meth:`InventoryReporter.observe` sees every event the watchers emit and takes the version from the
``nccl_version`` log-pattern lines of the followed training logs (NCCL prints it at init; the rank
supervisor's prefix and NCCL's header do not matter: :func:`ftd.platform.nccl_version.nccl_version`);
a new version wakes the reporter at once. The NCCL fact is the distinct versions of the newest line
per log file (at most :data:`MAX_NCCL_SOURCES` files), unknown until a job printed one.

Why on change only: the coordinator keeps the last inventory per node, and drift is judged between
reports. An unchanged inventory is sent again when the coordinator comes online (a restart or a new
leader: its state holds only what its ledger's recent events say; :meth:`resend_soon`, called by
the agent's inbound on the coordinator's status) and every ``resend_s`` (a day) as a backstop. A read
that does not finish within ``timeout_s`` (a hung NVML call, a stuck ``ofed_info``) is not waited
for: its facts are reported unknown with that reason and the next round does not start another
read while it is still running.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec

from ftd.agent.inventory.read import NvmlVersions, Runner, read_gpus, read_host, run_command
from ftd.catalog.hardware_profiles import HardwareCatalog, load_hardware_catalog
from ftd.config.schema import InventoryConfig
from ftd.events import Event, Kind, make_event
from ftd.logs import get_logger
from ftd.platform.inventory import Fact, Inventory, joined, unknown
from ftd.platform.nccl_version import nccl_version

__all__ = ["MAX_NCCL_SOURCES", "InventoryReporter"]

log = get_logger(__name__)

MAX_NCCL_SOURCES = 16
NCCL_NOT_SEEN = "no job on this node has printed NCCL's version yet (agent.logs must follow its output)"


class InventoryReporter:
    """Reads and reports the node's inventory (module docstring). A watcher: ``name``, ``run()``."""

    name = "inventory"

    def __init__(
        self,
        cfg: InventoryConfig,
        node: str,
        emit: Callable[[Event], Awaitable[None]] | None,
        *,
        nvml: NvmlVersions | None,
        profile: str = "",
        catalog: HardwareCatalog | None = None,
        root: Path = Path("/"),
        runner: Runner = run_command,
    ) -> None:
        self.cfg = cfg
        self.node = node
        self._emit = emit
        self._nvml = nvml
        self._nvml_ready = False
        self._nvml_why = "NVML is not used on this node"
        self.profile = profile
        self.catalog = catalog if catalog is not None else load_hardware_catalog()
        self.root = root
        self._runner = runner
        self._nccl: OrderedDict[str, str] = OrderedDict()  # log file -> newest version seen there
        self._wake = asyncio.Event()
        self._reading: asyncio.Future[Inventory] | None = None
        self.last: Inventory | None = None
        self.reports = 0
        self._sent_at = 0.0
        self._force = False
        self.last_progress = time.monotonic()

    def resend_soon(self) -> None:
        """Send the inventory again at once, changed or not (the coordinator came online: a restart
        or a new leader, whose state holds only what its ledger's recent events say)."""
        self._force = True
        self._wake.set()

    def bind(self, emit: Callable[[Event], Awaitable[None]]) -> None:
        """Where reports go (the agent's emit, built after the reporter)."""
        self._emit = emit

    # --- NCCL, from the followed logs ----------------------------------------------------------------

    def observe(self, event: Event) -> None:
        """Take NCCL's version from a ``nccl_version`` log-pattern event (any other is ignored)."""
        if event.kind != Kind.LOG_PATTERN or event.data.get("pattern") != "nccl_version":
            return
        text = event.data.get("text")
        version = nccl_version(text) if isinstance(text, str) else None
        if version is None:
            return
        source = str(event.data.get("file") or event.data.get("job") or "")[:512]
        if self._nccl.get(source) == version:
            return
        self._nccl[source] = version
        self._nccl.move_to_end(source)
        while len(self._nccl) > MAX_NCCL_SOURCES:
            self._nccl.popitem(last=False)
        self._wake.set()

    def nccl_fact(self) -> Fact:
        return joined(list(self._nccl.values()), none_reason=NCCL_NOT_SEEN)

    # --- reading -------------------------------------------------------------------------------------

    def _nvml_or_none(self) -> NvmlVersions | None:
        if self._nvml is None or self._nvml_ready:
            return self._nvml if self._nvml_ready else None
        try:
            self._nvml.init()
        except Exception as exc:  # NvmlUnavailable and anything a broken library raises
            self._nvml_why = f"NVML unavailable: {exc}"
            return None
        self._nvml_ready = True
        return self._nvml

    def read(self) -> Inventory:
        """One full read (blocking: run it in a thread)."""
        nvml = self._nvml_or_none()
        gpus = read_gpus(nvml, profile=self.profile, catalog=self.catalog, why_none=self._nvml_why)
        host = read_host(
            self.root, ofed_command=self.cfg.ofed_command, timeout_s=self.cfg.timeout_s, runner=self._runner
        )
        return Inventory(
            profile=gpus.profile,
            driver=gpus.driver,
            cuda=gpus.cuda,
            vbios=gpus.vbios,
            gpu_serials=gpus.serials,
            nic_firmware=host.nic_firmware,
            ofed=host.ofed,
            nccl=self.nccl_fact(),
            kernel=host.kernel,
            os=host.os,
            gpus=gpus.gpus,
            nics=host.nics,
        )

    async def read_bounded(self) -> Inventory:
        """:meth:`read` in a thread, waited for at most ``timeout_s`` (+ the command's own bound)."""
        if self._reading is None or self._reading.done():
            self._reading = asyncio.ensure_future(asyncio.to_thread(self.read))
        bound = self.cfg.timeout_s * 2 + 1
        try:
            async with asyncio.timeout(bound):
                return await asyncio.shield(self._reading)
        except TimeoutError:
            why = f"reading the inventory took over {bound:g} s (a hung NVML or command)"
            stuck = unknown(why)
            names = (
                "profile",
                "driver",
                "cuda",
                "vbios",
                "gpu_serials",
                "nic_firmware",
                "ofed",
                "kernel",
                "os",
            )
            facts = dict.fromkeys(names, stuck)
            return msgspec.structs.replace(Inventory(), **facts, nccl=self.nccl_fact())

    async def report_once(self) -> bool:
        """Read, and emit when it differs from the last report; True when it emitted."""
        inventory = await self.read_bounded()
        now = self.last_progress = time.monotonic()
        resend = self.cfg.resend_s
        due = self._force or (resend > 0 and now - self._sent_at >= resend)
        if inventory == self.last and not due:
            return False
        self._force = False
        changed = _changed(self.last, inventory)
        self.last = inventory
        self._sent_at = now
        self.reports += 1
        log.info("inventory_report", changed=changed)
        event = make_event(
            self.node, Kind.INVENTORY, severity="info", source="inventory", data=inventory.to_data()
        )
        if self._emit is None:
            raise RuntimeError("InventoryReporter.report_once before bind()")
        await self._emit(event)
        return True

    async def run(self) -> None:
        while True:
            self._wake.clear()
            await self.report_once()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.cfg.interval_s):
                    await self._wake.wait()


def _changed(before: Inventory | None, after: Inventory) -> list[str]:
    if before is None:
        return ["all"]
    out: list[str] = [name for name, fact in after.facts().items() if fact != before.fact(name)]
    if after.gpus != before.gpus:
        out.append("gpus")
    if after.nics != before.nics:
        out.append("nics")
    return out
