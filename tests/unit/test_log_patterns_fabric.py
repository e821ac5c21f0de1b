"""The built-in log pattern table names NCCL and InfiniBand failures distinctly (issue #10).

Lines as NCCL, PyTorch's ProcessGroupNCCL and libibverbs print them; the first matching pattern
wins (the log watcher sends one event per line), so each line must land on its own name, and the
names whose text proves a fault below the application are the ``ib_*`` ones listed in the table's
comment.
"""

from __future__ import annotations

import pytest

from ftd.catalog.log_patterns import load_patterns

TABLE = load_patterns()

# The names whose text proves hardware (NIC, cable, port, fabric), as documented in the table.
HARDWARE = {"ib_device_fatal", "ib_port_error", "ib_transport_retry_exceeded", "ib_poll_cq_error"}
# ... and of those, the names that point at the logging node's own HCA or port.
LOCAL_HARDWARE = {"ib_device_fatal", "ib_port_error"}

LINES = [
    # NCCL >= 2.19: status as text and number
    (
        "node7:81234:81301 [3] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer "
        "10.12.0.9<52014> with status=transport retry counter exceeded(12) opcode=0 len=0 vendor err 129 "
        "(Send) localGid ::ffff:10.12.0.7 remoteGidsfe80::a288:c2ff:fe4b:1a2c hca mlx5_3",
        "ib_transport_retry_exceeded",
    ),
    # older NCCL: "with error 12, ..."
    (
        "node7:81234:81301 [3] NCCL WARN NET/IB : Got completion from peer 10.12.0.9<52014> with error 12, "
        "opcode 0, len 0, vendor err 129 (Send)",
        "ib_transport_retry_exceeded",
    ),
    (
        "NCCL WARN NET/IB : Got completion with error 12, opcode 1, len 21845, vendor err 129",
        ("ib_transport_retry_exceeded"),
    ),
    (
        "node7:1:2 [0] NCCL WARN NET/IB : Got completion from peer 10.0.0.2<1234> with status=RNR retry "
        "counter exceeded(13) opcode=1 len=0 vendor err 135 (Recv)",
        "ib_rnr_retry_exceeded",
    ),
    (
        "node7:1:2 [0] NCCL WARN NET/IB : Got completion from peer 10.0.0.2<1234> with status=Work Request "
        "Flushed Error(5) opcode=0 len=0 vendor err 249 (Send)",
        "ib_completion_error",
    ),
    ("node7:1:2 [0] NCCL WARN NET/IB : mlx5_2:1 Got async event : port error", "ib_port_error"),
    (
        "node7:1:2 [0] NCCL WARN NET/IB : mlx5_2:1 Got async event : local catastrophic error",
        ("ib_device_fatal"),
    ),
    ("node7:1:2 [0] NCCL WARN NET/IB : mlx5_2:1 Got async event : GID table change", "ib_async_event"),
    ("node7:1:2 [0] NCCL WARN Call to ibv_poll_cq() returned -1", "ib_poll_cq_error"),
    ("mlx5: node7: got completion with error:", "ib_completion_error"),
    # unchanged: other verbs failures are NCCL warnings, not IB evidence
    ("node3:1234:1250 [0] NCCL WARN Call to ibv_create_cq failed", "nccl_warn"),
    (
        "[rank3]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 3] Heartbeat monitor timed out! Process will be "
        "terminated after dumping debug info. workMetaList_.size()=1",
        "nccl_watchdog_stuck",
    ),
    (
        "[E ProcessGroupNCCL.cpp:1182] [PG 0 Rank 3] ProcessGroupNCCL's watchdog got stuck for 480 seconds "
        "without making progress in monitoring enqueued collectives.",
        "nccl_watchdog_stuck",
    ),
    (
        "[rank3]:[E ProcessGroupNCCL.cpp:607] [Rank 3] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=10853, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
        "600043 milliseconds before timing out.",
        "nccl_watchdog_timeout",
    ),
    (
        "[rank3]:[E ProcessGroupNCCL.cpp:1537] [PG 0 Rank 3] Timeout at NCCL work: 10853, last enqueued "
        "NCCL work: 10853, last completed NCCL work: 10852.",
        "nccl_watchdog_timeout",
    ),
    (
        "torch.distributed.DistBackendError: NCCL error in: "
        "../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, "
        "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error.",
        "nccl_system_error",
    ),
    ("RuntimeError: NCCL error: unhandled system error, NCCL version 2.21.5", "nccl_unhandled_system_error"),
]


def first(line: str) -> str | None:
    return next((p.name for p in TABLE if p.regex.search(line)), None)


@pytest.mark.parametrize(("line", "name"), LINES, ids=[f"{i}-{name}" for i, (_, name) in enumerate(LINES)])
def test_each_line_lands_on_its_own_name(line: str, name: str) -> None:
    assert first(line) == name


def test_names_are_distinct_and_prefixed() -> None:
    names = [p.name for p in TABLE]
    assert len(names) == len(set(names))
    fabric = [n for n in names if n.startswith(("ib_", "nccl_"))]
    assert set(fabric) >= HARDWARE
    # every hardware name comes before every NCCL name: a "NCCL WARN ... port error" line is IB evidence
    assert max(names.index(n) for n in HARDWARE) < min(names.index(n) for n in names if n.startswith("nccl_"))


def test_hardware_names_are_documented_in_the_table() -> None:
    from importlib import resources

    text = resources.files("ftd.catalog").joinpath("log_patterns.toml").read_text(encoding="utf-8")
    lists = [line for line in text.splitlines() if line.startswith("#   ib_")]
    documented = [{name.strip() for name in line.strip("# ").split(",")} for line in lists]
    assert documented == [HARDWARE, LOCAL_HARDWARE]


def test_application_errors_are_not_fabric() -> None:
    assert first("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB") == "cuda_oom"
    assert first("step 100 loss 2.31 ib_grad_norm 0.4") is None
