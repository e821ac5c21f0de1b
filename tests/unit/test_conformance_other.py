"""Conformance with the peers' expectations for every line that is not an Xid / SXid (issue #23).

Kernel lines (storage, NFS, NICs, GPUDirect, NVLink, CPU and kernel, OOM, hung tasks, resource
limits...) go through ftd's kernel-log parser; nvidia-resiliency-ext's training-log lines go through
ftd's log-pattern table (``ftd/catalog/log_patterns.toml``, first match wins, as the log watcher
reads it). Each peer names what it expects in its own words (gpud an ``event``, NVSentinel an
``errorCode``, node-problem-detector its rules' ``reason``, the EKS agent a ``reason``, gcm a
message, nvidia-resiliency-ext restart-agent registry ids): :data:`FTD_KIND` maps each of those
words, never a line, to the ftd kind (or log pattern) expected. A peer word missing from the table
fails the test, so new corpus entries cannot slip through unmapped.

Completeness per kind (issue #31): every positive expectation of every kind produces that kind, so
losing one detector fails the suite however few lines it had; ftd reports nothing only for the peer
words tests/conformance_divergences.toml lists (``[[positive]]``), and a negative line produces
nothing unless a ``[[negative]]`` there says why ftd reports it (docs/signals.md "Where ftd differs
from its peers"). Every divergence in the file must be used by the corpus.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ftd.catalog.log_patterns import LogPattern, load_patterns
from tests.conformance import Entry, divergences, entries, kernel_events, sequence_lines, sequences

LOG = "log_pattern:"  # prefix of an expected training-log pattern name

# The peer's word -> ftd's kind. ``None``: ftd reports nothing, on purpose (a ``[[positive]]`` of
# tests/conformance_divergences.toml says why).
FTD_KIND: dict[tuple[str, Any], str | None] = {
    # gpud (components/*/kmsg_matcher_test.go): event names
    ("event", "access_reg_failed"): "nic",
    ("event", "pci_power_insufficient"): "nic",
    ("event", "port_module_high_temperature"): "ib_link",  # a port module (cable) event: the link's
    ("event", "beyond_end_of_device"): "storage",
    ("event", "buffer_io_error"): "storage",
    ("event", "nvme_controller_timeout"): "storage",
    ("event", "nvme_device_disabled"): "storage",
    ("event", "nvme_path_failure"): "storage",
    ("event", "raid_array_failure"): "storage",
    ("event", "superblock_write_error"): "storage",
    ("event", "filesystem_read_only"): "fs_readonly",
    ("event", "cpu_blocked_too_long"): "hung_task",
    ("event", "cpu_soft_lockup"): "soft_lockup",
    ("event", "kernel_panic_cpu_pid_line"): "kernel_oops",
    ("event", "nfs_server_not_responding"): "netfs",
    ("event", "nfs_server_ok"): "netfs",
    ("event", "nfs_lock_reclaim_failed"): "netfs",
    ("event", "nfs_writeback_hang"): "netfs",
    ("event", "nvidia_nccl_segfault_in_libnccl"): "segfault",
    ("event", "nvidia_peermem_invalid_context"): "gpudirect",
    ("event", "nvlink_post_rx_detect_failure"): "nvlink",
    ("event", "vfs_file_max_limit_reached"): "resource_limit",
    ("expectedFound", True): "oom_kill",  # gpud TestGetContainerName: an oom-kill line's container
    # NVSentinel (syslog-health-monitor nicdriver): error codes
    ("errorCode", "access_reg_failed"): "nic",
    ("errorCode", "cmd_exec_timeout"): "nic",
    ("errorCode", "health_poll_failed"): "nic",
    ("errorCode", "unrecoverable_err"): "nic",
    ("errorCode", "netdev_watchdog"): "nic",
    ("errorCode", "pci_power_insufficient"): "nic",
    ("errorCode", "port_module_high_temp"): "ib_link",
    ("errorCode", "module_unplugged"): "ib_link",
    ("errorCode", "efa_admin_cmd_timeout"): "nic",
    ("errorCode", "efa_admin_queue_closed"): "nic",
    ("errorCode", "efa_admin_cmd_failed"): "nic",
    ("errorCode", "efa_device_reset_failed"): "nic",
    ("errorCode", "efa_device_not_ready"): "nic",
    # EKS node monitoring agent: condition reasons
    ("reason", "KernelBug"): "kernel_oops",
    ("reason", "SoftLockup"): "soft_lockup",
    ("reason", "ForkFailedOutOfPIDs"): "resource_limit",
    ("reason", "AppCrash"): "segfault",
    ("reason", "AppBlocked"): "hung_task",
    ("reason", "ConntrackExceededKernel"): "resource_limit",
    # node-problem-detector: the reasons of its shipped kernel-monitor rules
    ("npd", "OOMKilling"): "oom_kill",
    ("npd", "TaskHung"): "hung_task",
    ("npd", "DockerHung"): "hung_task",
    ("npd", "KernelOops"): "kernel_oops",
    ("npd", "FilesystemIsReadOnly"): "fs_readonly",
    ("npd", "Ext4Error"): "storage",
    ("npd", "CperHardwareErrorFatal"): "machine_check",
    ("npd", "UnregisterNetDevice"): "kernel_oops",
    # gcm health checks: messages
    ("msg", "ib link flap detected."): "ib_link",
    ("msg", "eth link flap detected."): None,
    # nvidia-resiliency-ext restart agent (L0 registry ids) -> ftd's log patterns
    ("registry", "configuration_validation_failure"): LOG + "config_error",
    ("registry", "argument_validation_failure"): LOG + "argument_error",
    ("registry", "artifact_or_path_not_found"): LOG + "path_not_found",
    ("registry", "checkpoint_compatibility_mismatch"): LOG + "checkpoint_mismatch",
    ("registry", "shape_mismatch"): LOG + "shape_mismatch",
    ("registry", "nan_or_inf"): LOG + "nan_or_inf",
    ("registry", "time_limit"): LOG + "time_limit",
}

_GENERIC_REGISTRY_IDS = {"observed_exception"}  # a class every exception line has, not a signature


def peer_words(entry: Entry) -> list[tuple[str, Any]]:
    """What the peer expects, as ``FTD_KIND`` keys (every key the entry's sources name)."""
    words: list[tuple[str, Any]] = []
    for expect in entry.expectations():
        for field in ("event", "errorCode", "reason", "msg"):
            if expect.get(field):
                words.append((field, expect[field]))
        if expect.get("expectedFound") is True:
            words.append(("expectedFound", True))
        for rule in expect.get("matched_rules") or []:
            words.append(("npd", rule["reason"]))
        for registry_id in expect.get("registry_ids_superset_of") or []:
            if registry_id not in _GENERIC_REGISTRY_IDS:
                words.append(("registry", registry_id))
    return list(dict.fromkeys(words))


def first_log_pattern(line: str, table: list[LogPattern]) -> str | None:
    return next((LOG + row.name for row in table if row.regex.search(line)), None)


def ftd_outcome(entry: Entry, table: list[LogPattern]) -> list[str]:
    """ftd's kinds for the entry: kernel events, or the training-log pattern that matches first."""
    if entry.peer == "nvidia-resiliency-ext":
        name = first_log_pattern("\n".join(entry.lines), table)
        return [name] if name else []
    return [event.kind.value for event in kernel_events(entry.lines)]


def _other() -> list[Entry]:
    return [e for e in entries() if e.kind == "other"]


def test_every_peer_expectation_is_mapped() -> None:
    unmapped = sorted(
        {str(word) for e in _other() if e.match is True for word in peer_words(e) if word not in FTD_KIND}
    )
    assert unmapped == []
    assert all(peer_words(e) for e in _other() if e.match is True)


def test_other_positives_produce_the_expected_kind_every_kind_complete() -> None:
    table = load_patterns()
    documented = divergences().positive
    positives = [e for e in _other() if e.match is True]
    assert len(positives) >= 160  # 169 in the corpus today
    expected_by_kind: Counter[str] = Counter()
    hit_by_kind: Counter[str] = Counter()
    misses: list[str] = []
    used: set[tuple[str, str]] = set()
    for entry in positives:
        words = peer_words(entry)
        kinds = {FTD_KIND[word] for word in words}
        assert len(kinds) == 1, (entry.where(), words)  # the peer's words agree on one ftd kind
        (kind,) = kinds
        got = ftd_outcome(entry, table)
        if kind is None:  # ftd reports nothing here, on purpose: the file must say why
            why = [word for word in words if word in documented]
            assert why, f"{entry.where()}: FTD_KIND maps {words} to nothing without a documented divergence"
            used.update(why)
            if got:
                misses.append(f"{entry.where()}: documented as nothing, got {got}")
            continue
        expected_by_kind[kind] += 1
        if kind in got:
            hit_by_kind[kind] += 1
        else:
            misses.append(f"{entry.where()}: expected {kind}, got {got}")
    report = ", ".join(f"{k} {hit_by_kind[k]}/{n}" for k, n in sorted(expected_by_kind.items()))
    hits = sum(hit_by_kind.values())
    print(
        f"\nother positives: {hits}/{sum(expected_by_kind.values())} produce the expected kind;"
        f" per kind: {report}"
    )
    incomplete = {k: f"{hit_by_kind[k]}/{n}" for k, n in expected_by_kind.items() if hit_by_kind[k] != n}
    assert incomplete == {}, "kinds not detected on every corpus line of theirs:\n  " + "\n  ".join(misses)
    assert misses == []
    assert used == set(documented), (
        f"documented divergences the corpus no longer has: {set(documented) - used}"
    )


def test_other_negatives_produce_nothing_unless_a_documented_divergence() -> None:
    table = load_patterns()
    negatives = [e for e in _other() if e.match is False]
    assert len(negatives) >= 60
    documented = divergences().negative
    wrong: list[str] = []
    used: Counter[str] = Counter()
    for entry in negatives:
        got = ftd_outcome(entry, table)
        if entry.peer == "nvidia-resiliency-ext":  # "must not include registry id X"
            banned = {
                FTD_KIND[("registry", x["must_not_include_registry_id"])]
                for x in entry.expectations()
                if "must_not_include_registry_id" in x
            }
            if banned & set(got):
                wrong.append(f"{entry.where()}: {got}")
            continue
        if not got:
            continue
        allowed = [(entry.peer, test) for test in entry.tests if (entry.peer, test) in documented]
        if allowed and set(got) <= documented[allowed[0]][0]:
            used[allowed[0]] += 1
        else:
            wrong.append(f"{entry.where()}: {got}")
    print(f"\nother negatives: {len(negatives)}; documented divergences used: {dict(used)}")
    assert wrong == []
    assert set(used) == set(documented), (
        f"documented divergences the corpus no longer has: {set(documented) - set(used)}"
    )


def test_unasserted_lines_never_break_the_parser_and_keep_their_address() -> None:
    """``match: null`` entries: NVSentinel's BDF extraction cases and gcm's docstring examples."""
    for entry in [e for e in _other() if e.match is None]:
        events = kernel_events(entry.lines)
        for expect in entry.expectations():
            bdf = expect.get("extracted_BDF")
            if bdf and events and events[0].pci is not None:
                assert events[0].pci == bdf.lower(), entry.where()


def _oom_victims(case: dict[str, Any]) -> list[tuple[int, str]]:
    out = []
    for event in case["expected"]["events"]:
        message = event["message"]  # "... victim process: NAME, pid: N"
        name = message.split("victim process: ", 1)[1].rsplit(", pid: ", 1)
        out.append((int(name[1]), name[0]))
    return out


def test_gpud_oom_sequences() -> None:
    cases = [c for c in sequences("gpud") if "events" in c.get("expected", {})]
    assert len(cases) == 13
    for case in cases:
        events = [e for e in kernel_events(sequence_lines(case)) if e.kind.value == "oom_kill"]
        assert [(e.pid, e.process) for e in events] == _oom_victims(case), case["test"]


def test_gpud_kernel_panic_traces() -> None:
    cases = [c for c in sequences("gpud") if c.get("expected", {}).get("eventName") == "kernel_panic"]
    assert len(cases) == 8
    found = 0
    for case in cases:
        events = [e for e in kernel_events(sequence_lines(case)) if e.kind.value == "kernel_oops"]
        assert events, case["test"]
        found += 1
    assert found == 8


def test_npd_problem_logs() -> None:
    """node-problem-detector's e2e problem logs: every kind its rules expect is among ftd's events."""
    cases = sequences("node-problem-detector")
    assert len(cases) == 8
    for case in cases:
        wanted = {FTD_KIND[("npd", rule["reason"])] for rule in case["expected"]["rules_matched"]}
        got = {e.kind.value for e in kernel_events(sequence_lines(case))}
        assert wanted <= got, (case["path"], wanted, got)
