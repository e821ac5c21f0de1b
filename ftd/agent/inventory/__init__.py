"""What this node runs (issue #36): driver, CUDA, VBIOS, serials, NIC firmware, OFED, NCCL, kernel, OS."""
