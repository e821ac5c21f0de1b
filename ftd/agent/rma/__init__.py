"""The diagnostic bundle of a node drained for repair (issue #36): bug report, kernel log, NVML."""
