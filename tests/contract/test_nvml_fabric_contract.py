"""The NVML seam's fabric questions (issue #35), one contract for the fake and the real backend.

``pcie_link`` (current and maximum PCIe generation and width) and ``nvlink_errors`` (error counters
summed over active links) must answer the same way from :class:`FakeNvml` (what the fabric watcher's
tests use) and :class:`RealNvml`: the same values for the same GPU state, ``NvmlNotSupported`` where
the GPU does not answer, ``NvmlGpuLost`` for a GPU that is gone. The real backend runs here through
pynvml's own module with only its NVML calls answered by the scripted state (no GPU needed), and on a
GPU machine against the real driver (the one skip CI allows).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ftd.agent.watchers.nvml.backend import (
    NvmlBackend,
    NvmlGpuLost,
    NvmlNotSupported,
    NvmlUnavailable,
    PcieLinkInfo,
)
from ftd.agent.watchers.nvml.fake import FakeNvml
from ftd.agent.watchers.nvml.real import RealNvml
from tests.skips import skip_without_gpu

#: A GPU's scripted state: its PCIe link (None: not supported), its links' states and error counters.
State = dict[str, Any]
LINK = PcieLinkInfo(cur_gen=4, max_gen=5, cur_width=8, max_width=16)
COUNTERS = {"replay": 3, "recovery": 1, "crc_flit": 7, "crc_data": 0, "ecc_data": 0}


def fake_backend(state: State, monkeypatch: pytest.MonkeyPatch) -> NvmlBackend:
    nvml = FakeNvml(count=1)
    gpu = nvml.gpus[0]
    gpu.pcie = state["pcie"]
    if state["links"] is not None:
        gpu.with_nvlink(len(state["links"]))
        gpu.nvlink_links = dict(enumerate(state["links"]))
        # the fake keeps totals over active links; the state gives per-link counters
        gpu.nvlink = {name: value * sum(state["links"]) for name, value in COUNTERS.items()}
    gpu.lost = state["lost"]
    nvml.init()
    return nvml


def real_backend(state: State, monkeypatch: pytest.MonkeyPatch) -> NvmlBackend:
    pynvml = pytest.importorskip("pynvml")  # nvidia-ml-py: installed with the daemon

    def call(answer: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any) -> Any:
            if state["lost"]:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
            return answer(*args)

        return wrapped

    def pcie(field: str) -> Callable[[object], int]:
        def get(handle: object) -> int:
            if state["pcie"] is None:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return int(getattr(state["pcie"], field))

        return get

    def link_state(handle: object, link: int) -> int:
        links = state["links"]
        if links is None or link >= len(links):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED if links is None or link == 0 else 2)
        return int(links[link])

    by_counter = {
        pynvml.NVML_NVLINK_ERROR_DL_REPLAY: "replay",
        pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: "recovery",
        pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: "crc_flit",
        pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA: "crc_data",
        pynvml.NVML_NVLINK_ERROR_DL_ECC_DATA: "ecc_data",
    }

    def error_counter(handle: object, link: int, counter: int) -> int:
        return COUNTERS[by_counter[counter]]

    answers: dict[str, Callable[..., Any]] = {
        "nvmlDeviceGetHandleByIndex": lambda index: f"handle-{index}",
        "nvmlDeviceGetCurrPcieLinkGeneration": pcie("cur_gen"),
        "nvmlDeviceGetMaxPcieLinkGeneration": pcie("max_gen"),
        "nvmlDeviceGetCurrPcieLinkWidth": pcie("cur_width"),
        "nvmlDeviceGetMaxPcieLinkWidth": pcie("max_width"),
        "nvmlDeviceGetNvLinkState": link_state,
        "nvmlDeviceGetNvLinkErrorCounter": error_counter,
    }
    for name, answer in answers.items():
        monkeypatch.setattr(pynvml, name, call(answer))
    backend = RealNvml()
    backend._nv = pynvml  # what init() sets after nvmlInit, which needs a driver
    return backend


BACKENDS = {"fake": fake_backend, "real": real_backend}


def _state(**over: Any) -> State:
    return {"pcie": LINK, "links": [True, True, False, True], "lost": False, **over}


@pytest.mark.parametrize("make", BACKENDS.values(), ids=BACKENDS.keys())
def test_pcie_link_answers_the_same(
    make: Callable[..., NvmlBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert make(_state(), monkeypatch).pcie_link(0) == LINK
    with pytest.raises(NvmlNotSupported):
        make(_state(pcie=None), monkeypatch).pcie_link(0)
    with pytest.raises(NvmlGpuLost):
        make(_state(lost=True), monkeypatch).pcie_link(0)


@pytest.mark.parametrize("make", BACKENDS.values(), ids=BACKENDS.keys())
def test_nvlink_errors_are_summed_over_active_links(
    make: Callable[..., NvmlBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    totals = make(_state(), monkeypatch).nvlink_errors(0)
    assert totals == {**{name: value * 3 for name, value in COUNTERS.items()}, "active_links": 3}
    with pytest.raises(NvmlNotSupported):
        make(_state(links=None), monkeypatch).nvlink_errors(0)


def test_the_real_driver_answers_in_the_contracts_shape() -> None:
    """On a GPU machine: every GPU's link is a PcieLinkInfo within PCIe's bounds; its NVLink counters
    are non-negative integers with the keys the fabric watcher judges."""
    backend = RealNvml()
    try:
        backend.init()
    except NvmlUnavailable as exc:
        skip_without_gpu(f"NVML does not initialise: {exc}")
    try:
        count = backend.device_count()
        if count == 0:
            skip_without_gpu("NVML sees no GPU")
        for index in range(count):
            link = backend.pcie_link(index)
            assert 1 <= link.cur_gen <= link.max_gen <= 6, link
            assert link.max_width in (1, 2, 4, 8, 16, 32) and 0 <= link.cur_width <= link.max_width, link
            try:
                totals = backend.nvlink_errors(index)
            except NvmlNotSupported:
                continue
            assert set(totals) == {*COUNTERS, "active_links"}
            assert all(isinstance(v, int) and v >= 0 for v in totals.values())
    finally:
        backend.shutdown()
