"""Built-in rules: policy as pure functions of (event, read-only cluster view) -> action requests.

Each module imports only the rule contract (:mod:`ftd.plugin`), the Xid catalog and the standard
library (``tests/unit/test_layering.py`` enforces it), does no I/O, and is an ordinary pluggy plugin
an operator can disable by its name (``coordinator.disabled_rules = ["xid_catalog"]``). The
coordinator names them as strings (``ftd.coordinator.decide.plugins.DEFAULT_RULES``), so nothing here is
imported until a plugin manager is built. Site policy an operator copies and edits lives in the
repository's top-level ``rules/`` folder, not here.

Built-in rules (each module's docstring has its table; ``tests/replay/scenarios/`` replays each):

=================  ==================================================================================
rule               decides on
=================  ==================================================================================
xid_catalog        Xids and the fall-off banner, by the bucket -> plan table of
                   :mod:`ftd.catalog.remedy` (the one ``ftd xid explain`` prints): restart in place
                   (application Xids, crash-loop policy), reset after the save, drain, notify, nothing;
                   Xid 48 with 63/64 drains; NVLink5 144-150 by their Fatal/Nonfatal decode; a
                   training-log line that reports an Xid (``cuda_uncorrectable_ecc``: 48,
                   ``cuda_device_unavailable``: 79) by that Xid's plan (no GPU named: drain)
app_faults         application error log patterns (cuda_oom, cuda_error, segfault, ...): restart in place
                   with crash-loop backoff, notify after ``policy.app_fault_restart_limit``; never drain;
                   a signature that would fail again (``disposition = "stop"`` in the pattern table:
                   config_error, nan_or_inf, time_limit, ...): stop the job, no save, no restart, notify
nccl_ib            ``nccl_*`` / ``ib_*`` log failures: restart in place; drain only with hardware evidence
                   on the node (``ib_link`` down, IB fatal lines, a hardware Xid); ``ib_link``: notify
sxid               fatal NVSwitch SXid: restart excluding the node, drain
gpu_health         ``gpu_missing``, NVLink down: drain after the save; retired pages: reset after the
                   save; PCIe replays, NVLink errors, NVML stalls: notify
thermal            hot / throttling: notify; sustained throttling: save (no stop) + notify
memory             trainer RSS leak: save, then save-and-restart if it continues or is critical; host
                   memory low: save; critical: save-and-restart in place; never drain
kernel             fatal PCIe AER: drain after the save; uncorrected AER, OOM killer, hung task: notify
ecc_remap          no spare rows (row-remap failure), SRAM over the limit: drain for RMA after the save;
                   remap pending: reset after the save; correctable-ECC rate over threshold: notify
repeat_offender    a second hardware incident of the same signature on one GPU within 24 h: drain;
                   a GPU that arrives with faults from another node: notify (see ``_incidents``)
fs_fill            forecast or warning: save (no stop); critical crossing: save, stop, requeue
                   excluding the node; ENOSPC on a still-critical fs: move the job off again
hang               heartbeat lost / log stale / NCCL watchdog timeout: one diagnose_hang of the job; on its
                   verdict: a confident culprit -> restart without it (no save) and drain it as a
                   suspect; else restart in place or stop (``coordinator.hang_unclear``), never exclude
node_death         node offline with jobs: restart them excluding the node
straggler          a rank far behind: notify
shared_fs          a shared filesystem's outage (``netfs`` down, a shared mount read-only): one notify when
                   it starts, one when it recovers, never a drain (saves on it are paused meanwhile by
                   the decision stage, :mod:`ftd.coordinator.decide.save_path`)
storage            a node's local disk lost (NVMe disabled / no path, md array failed) or a local
                   filesystem read-only: move the job, then drain; disk I/O errors: notify
host               NIC fatal (mlx5, EFA), NVLink link-mask failure, uncorrected MCE, kernel oops / panic:
                   move the job, then drain; NIC warnings, soft lockups, peermem errors, resource limits,
                   other kernel BUG reports: notify; a segfault in libnccl/libcuda of a job's process:
                   the application-fault path (restart in place, crash-loop backoff)
fabric             a fabric counter over a fatal threshold (symbol errors over the BER limit, link downed,
                   link integrity, buffer overrun): move the job, then drain; warnings, a port below its
                   profile's rate, a PCIe link below its maximum: notify; congestion (pause storms,
                   ECN/CNP): notify as the fabric's, never a drain (docs/fabric.md)
supervisor         a job's rank supervisor (``ftd run``) lost or failed on a node the job trains on:
                   restart with that node avoided (its slot goes to a spare, no drain); on a spare:
                   notify
=================  ==================================================================================

``_incidents`` (not a plugin) is what they share to see one fault as one incident: which records
implicate hardware, the job-level application-fault policy, incident windows.
"""
