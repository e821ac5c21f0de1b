"""A sysfs tree for the fabric watcher's tests, written by a separate process in the kernel's layout.

:class:`TreeWriter` starts one Python process that writes files, directories and relative symlinks
under a root on request (JSON lines on its stdin, ``ok`` back when each batch is on disk), so the
watcher reads files another process wrote, as on a node, at the cost of one process per test.
:func:`node_tree` lays out a node: PCI functions under ``sys/devices/pci0000:00/...`` with their
``sys/bus/pci/devices`` links (a GPU and an InfiniBand NIC behind one PCIe switch, a RoCE NIC under
another root port), ``sys/class/infiniband/<dev>`` with ``device`` links, ``ports/1/`` (``state``,
``phys_state``, ``link_layer``, ``rate``, ``counters/``, ``hw_counters/``) and ``device/net/<netdev>``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

_WRITER = r"""
import json, os, sys
root = sys.argv[1]
for line in sys.stdin:
    for op in json.loads(line):
        path = os.path.join(root, op["path"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if op["op"] == "write":
            if os.path.isdir(path) and not os.path.islink(path):
                os.rmdir(path)
            with open(path + ".tmp", "w") as f:
                f.write(op["text"])
            os.replace(path + ".tmp", path)
        elif op["op"] == "link":
            if os.path.lexists(path):
                os.remove(path)
            os.symlink(op["target"], path)
        elif op["op"] == "mkdir":
            if os.path.isfile(path):
                os.remove(path)
            os.makedirs(path, exist_ok=True)
        elif op["op"] == "remove":
            os.remove(path)
    sys.stdout.write("ok\n")
    sys.stdout.flush()
"""

GPU = "0000:18:00.0"
IB_NIC = "0000:17:00.0"
ROCE_NIC = "0000:5a:00.0"
#: Where each function sits in the PCI tree (host bridge, root port, switch ports, the function).
PCI_PATHS = {
    GPU: "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/" + GPU,
    IB_NIC: "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/" + IB_NIC,
    ROCE_NIC: "pci0000:00/0000:00:03.0/" + ROCE_NIC,
}
IB_COUNTERS = ("symbol_error", "link_downed", "link_error_recovery", "port_rcv_errors",
               "local_link_integrity_errors", "excessive_buffer_overrun_errors", "port_xmit_discards",
               "port_rcv_remote_physical_errors")  # fmt: skip
HW_COUNTERS = ("out_of_buffer", "np_cnp_sent", "np_ecn_marked_roce_packets", "rp_cnp_handled")


class TreeWriter:
    """One writer process for ``root`` (module docstring); use as a context manager."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(root)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def __enter__(self) -> TreeWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        self._proc.wait(timeout=30)

    def apply(self, ops: list[dict[str, Any]]) -> None:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps(ops) + "\n")
        self._proc.stdin.flush()
        assert self._proc.stdout.readline() == "ok\n", "the tree writer failed"

    def write(self, files: dict[str, str]) -> None:
        self.apply([{"op": "write", "path": p, "text": t} for p, t in files.items()])

    def link(self, path: str, target: str) -> None:
        self.apply([{"op": "link", "path": path, "target": target}])

    def mkdir(self, path: str) -> None:
        self.apply([{"op": "mkdir", "path": path}])

    def remove(self, path: str) -> None:
        self.apply([{"op": "remove", "path": path}])


def pci_function(
    w: TreeWriter, bdf: str, *, vendor: str, klass: str, width: int = 16, gts: str = "32.0"
) -> None:
    real = f"sys/devices/{PCI_PATHS[bdf]}"
    w.write(
        {
            f"{real}/vendor": vendor + "\n",
            f"{real}/class": klass + "\n",
            f"{real}/current_link_speed": f"{gts} GT/s PCIe\n",
            f"{real}/max_link_speed": f"{gts} GT/s PCIe\n",
            f"{real}/current_link_width": f"{width}\n",
            f"{real}/max_link_width": f"{width}\n",
        }
    )
    w.link(f"sys/bus/pci/devices/{bdf}", "../../../devices/" + PCI_PATHS[bdf])


def ib_device(
    w: TreeWriter,
    name: str,
    bdf: str,
    *,
    layer: str,
    rate: str,
    netdev: str,
    counters: dict[str, int] | None = None,
) -> None:
    port = f"sys/class/infiniband/{name}/ports/1"
    values = {c: 0 for c in IB_COUNTERS} | (counters or {})
    w.write(
        {
            f"{port}/state": "4: ACTIVE\n",
            f"{port}/phys_state": "5: LinkUp\n",
            f"{port}/link_layer": layer + "\n",
            f"{port}/rate": rate + "\n",
            **{f"{port}/counters/{c}": f"{v}\n" for c, v in values.items()},
            **{f"{port}/hw_counters/{c}": "0\n" for c in HW_COUNTERS},
            f"sys/devices/{PCI_PATHS[bdf]}/net/{netdev}/dev_port": "0\n",
        }
    )
    w.link(f"sys/class/infiniband/{name}/device", "../../../devices/" + PCI_PATHS[bdf])


def node_tree(w: TreeWriter) -> None:
    """A GPU and an NDR InfiniBand NIC behind one switch, a 400 Gb/s RoCE NIC elsewhere."""
    pci_function(w, GPU, vendor="0x10de", klass="0x030200", gts="32.0")
    pci_function(w, IB_NIC, vendor="0x15b3", klass="0x020700", gts="32.0")
    pci_function(w, ROCE_NIC, vendor="0x15b3", klass="0x020000", gts="32.0")
    ib_device(w, "mlx5_0", IB_NIC, layer="InfiniBand", rate="400 Gb/sec (4X NDR)", netdev="ibp23s0")
    ib_device(w, "mlx5_1", ROCE_NIC, layer="Ethernet", rate="400 Gb/sec (4X NDR)", netdev="enp90s0")


def counter(name: str, port: str = "mlx5_0") -> str:
    return f"sys/class/infiniband/{port}/ports/1/counters/{name}"


def fake_ethtool(path: Path, stats: Path) -> Path:
    """An ``ethtool`` stand-in (a real executable): ``-S DEV`` prints ``stats``'s lines for DEV."""
    path.write_text(
        "#!/bin/sh\n"
        '[ "$1" = "-S" ] || exit 64\n'
        f'f="{stats}.$2"\n'
        '[ -f "$f" ] || { echo "Cannot get stats information: Operation not supported" >&2; exit 94; }\n'
        'echo "NIC statistics:"\n'
        'cat "$f"\n'
    )
    path.chmod(0o755)
    return path
