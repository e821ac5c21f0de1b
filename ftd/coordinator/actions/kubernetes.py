"""Kubernetes behind the :class:`~ftd.coordinator.actions.scheduler.Scheduler` seam (``kubernetes_asyncio``).

Install with the ``k8s`` extra. Every request goes to the API server named in ``[coordinator.kubernetes]``
(or the in-cluster service) with a bearer token re-read from ``token_file`` on every request (projected
service-account tokens rotate), and a per-request timeout. API errors become :class:`SchedulerError`
carrying the HTTP method, path, status and the server's message.

Semantics, mapped onto the scheduler contract:

* **drain(node, reason)** = cordon + taint + evict, in that order (so evicted pods cannot land on the
  node again): one JSON *merge patch* (``application/merge-patch+json``) on the node sets
  ``spec.unschedulable = true``, replaces ftd's own taint ``{taint_key}=<reason-slug>:NoSchedule``
  (other taints are kept as they are) and writes the annotations ``ftd.dev/drained-by=ftd``,
  ``ftd.dev/drain-reason=<sanitized reason>`` and ``ftd.dev/cordoned-by-ftd`` (``"false"`` when the node
  was already cordoned by someone else, so a later resume leaves that cordon alone). The patch carries
  ``metadata.resourceVersion``: the API server refuses it (409) if the node changed since it was read,
  and the read-modify-write is retried, so a concurrent edit of the taints is never lost. Then every pod
  on the node is evicted through the Eviction API (``POST .../pods/{pod}/eviction``, a ``policy/v1``
  ``Eviction``), which honours PodDisruptionBudgets; DaemonSet pods, mirror (static) pods and finished
  pods are skipped, as ``kubectl drain`` does. A pod the budget protects (429) is left running and
  reported in :attr:`KubernetesScheduler.last_drain` — the node is cordoned either way, so the drain
  itself succeeded. Eviction can be turned off (``evict = false``) when checkpoint_restart should be
  the only thing that moves training pods. Draining a drained node replaces the reason and taint value.
* **cordon(node, reason)** / **evict_node(node)**: the two halves of drain, for the coordinator's
  drain_node, which cordons at once and evicts only once the node's jobs have saved and stopped
  (:mod:`ftd.coordinator.actions.drain`), so an eviction never races the save handshake.
* **resume(node)** = remove ftd's taint and annotations, and uncordon *only if ftd cordoned it*. A node
  that is not drained is a no-op; a node cordoned by someone else (no ``drained-by=ftd``) raises, so
  ftd never undoes an operator's cordon.
* **requeue(job, exclude)** — the choice made here: a job is the set of pods labelled
  ``{job_label}={job}`` in ``namespace`` or, when none is, labelled with that name by a JobSet, a
  Kubeflow PyTorchJob or a batch/v1 Job (:data:`TRAINING_JOB_LABELS`); requeue *deletes those pods*
  (``DELETE .../pods/{pod}`` with ``propagationPolicy: Background``) and lets their controller
  recreate them: a ``batch/v1`` Job (with ``backoffLimit``), a JobSet, or a Kubeflow PyTorchJob with
  ``restartPolicy: OnFailure/ExitCode`` recreate deleted pods; bare pods are simply gone. Kubernetes
  has no per-job "excluded nodes" for an
  existing Job (the pod template is immutable), so exclusion is node-wide: each excluded node is
  cordoned and tainted (reason ``excluded from job J``, no eviction) before the pods are deleted, unless
  ftd already drained it; ``resume_node`` undoes it. Excluded nodes are validated first (an unknown one
  raises before anything is touched). Known limit: a requeue retried after the controller already
  recreated the pods deletes them once more (one extra restart, only after a coordinator crash
  mid-action); pods already terminating are not deleted again.
* **reboot(node, ...)**: not supported -- the Kubernetes API cannot reboot a node; it raises
  :class:`SchedulerError` saying so (the GPU reset's escalation then drains the node instead).
* **node_info / list_nodes / job_info**: ``state`` is kubectl's STATUS spelling
  (``Ready,SchedulingDisabled``), ``drained`` is "cordoned or carrying ftd's taint", ``down`` is "not
  Ready", ``reason`` is ftd's annotation (``None`` for a cordon ftd did not make). A job's state is
  RUNNING if any pod runs, PENDING if any is pending, FAILED if any failed, COMPLETED if all
  succeeded; ``restarts`` is the sum of its containers' ``restartCount`` (Kubernetes' own count;
  pods recreated by a requeue start again from 0), and ``excluded`` lists the cordoned nodes
  carrying ftd's taint.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ftd.coordinator.actions.scheduler import JobInfo, NodeInfo, SchedulerError, sanitize_reason
from ftd.events import Interruption
from ftd.logs import get_logger

if TYPE_CHECKING:
    from ftd.config import KubernetesConfig

log = get_logger(__name__)

DRAINED_BY = "ftd.dev/drained-by"
DRAIN_REASON = "ftd.dev/drain-reason"
CORDONED_BY_FTD = "ftd.dev/cordoned-by-ftd"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
MERGE_PATCH = "application/merge-patch+json"
_CONFLICT_RETRIES = 5
_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_LABEL_VALUE_RE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


#: Labels the common training controllers put on their pods, whose value is the job's name: a JobSet
#: (jobset.x-k8s.io), a Kubeflow PyTorchJob (training-operator) and a plain batch/v1 Job. A job id is
#: looked up under ``job_label`` first, then under these, so such a job needs no label of ftd's own.
TRAINING_JOB_LABELS = (
    "jobset.sigs.k8s.io/jobset-name",
    "training.kubeflow.org/job-name",
    "batch.kubernetes.io/job-name",
)


def reason_slug(reason: str) -> str:
    """Taint value from a reason: ``"ftd: Xid 79 on GPU 3"`` -> ``"xid-79-on-gpu-3"`` (label rules)."""
    text = reason.strip()
    if text.lower().startswith("ftd:"):
        text = text[4:]
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:63].strip("-")
    return slug or "fault"


def _check_name(name: str, what: str) -> str:
    if not _NAME_RE.match(name):
        raise SchedulerError(f"invalid Kubernetes {what} name {name!r}")
    return name


class KubernetesScheduler:
    """Drain, resume and requeue through the Kubernetes API (see the module docstring)."""

    name = "kubernetes"

    def __init__(
        self,
        *,
        host: str,
        token_file: str | None = None,
        token: str | None = None,
        ca_file: str | None = None,
        namespace: str = "default",
        taint_key: str = "ftd.dev/fault",
        job_label: str = "ftd.dev/job",
        evict: bool = True,
        timeout_s: float = 30.0,
    ) -> None:
        self.host = host.rstrip("/")
        self.token_file = token_file
        self.token = token
        self.ca_file = ca_file
        self.namespace = namespace
        self.taint_key = taint_key
        self.job_label = job_label
        # The labels a job's pods are found by, in order: ftd's own, then the training operators'.
        self.job_labels = (job_label, *(label for label in TRAINING_JOB_LABELS if label != job_label))
        self.evict = evict
        self.timeout_s = timeout_s
        self.last_drain: dict[str, Any] = {}
        self._client: Any = None
        self._core: Any = None

    @classmethod
    def from_config(cls, cfg: KubernetesConfig) -> KubernetesScheduler:
        host = cfg.host
        if host is None:
            svc, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
            host = f"https://{svc}:{port or 443}" if svc else "https://kubernetes.default.svc"
        ca_file = cfg.ca_file if cfg.ca_file and Path(cfg.ca_file).exists() else None
        return cls(
            host=host,
            token_file=cfg.token_file,
            ca_file=ca_file,
            namespace=cfg.namespace,
            taint_key=cfg.taint_key,
            job_label=cfg.job_label,
            evict=cfg.evict,
            timeout_s=cfg.timeout_s,
        )

    # -- plumbing ---------------------------------------------------------------------------------

    def _read_token(self) -> str | None:
        if self.token is not None:
            return self.token
        if not self.token_file:
            return None
        try:
            return Path(self.token_file).read_text().strip() or None
        except OSError as exc:
            raise SchedulerError(f"cannot read Kubernetes token file {self.token_file}: {exc}") from exc

    def _api(self) -> Any:
        if self._core is None:
            try:
                from kubernetes_asyncio import client as k8s
            except ImportError as exc:  # pragma: no cover - depends on the install
                missing = "kubernetes_asyncio is not installed: pip install 'ftd-daemon[k8s]'"
                raise SchedulerError(missing) from exc
            conf = k8s.Configuration(host=self.host)
            conf.ssl_ca_cert = self.ca_file
            conf.api_key_prefix["BearerToken"] = "Bearer"

            def refresh(c: Any) -> None:  # a rotated token is picked up on the next request
                token = self._read_token()
                if token is None:
                    c.api_key.pop("BearerToken", None)
                else:
                    c.api_key["BearerToken"] = token

            conf.refresh_api_key_hook = refresh
            refresh(conf)
            self._client = k8s.ApiClient(conf)
            self._core = k8s.CoreV1Api(self._client)
        return self._core

    async def close(self) -> None:
        client, self._client, self._core = self._client, None, None
        if client is not None:
            await client.close()

    async def _call(self, what: str, fn: str, *args: Any, ok: tuple[int, ...] = (), **kwargs: Any) -> Any:
        """Call ``CoreV1Api.fn``; an API error in ``ok`` returns its status instead of raising."""
        from kubernetes_asyncio.client.exceptions import ApiException

        api = self._api()
        try:
            return await getattr(api, fn)(*args, _request_timeout=self.timeout_s, **kwargs)
        except ApiException as exc:
            if exc.status in ok:
                return int(exc.status)
            raise SchedulerError(
                f"kubernetes {what} failed", returncode=exc.status, stderr=_api_message(exc)
            ) from None
        except (TimeoutError, OSError) as exc:
            raise SchedulerError(f"kubernetes {what} failed: {type(exc).__name__}: {exc}") from exc
        except Exception as exc:  # aiohttp.ClientError and friends, without importing aiohttp here
            if type(exc).__module__.startswith("aiohttp"):
                raise SchedulerError(f"kubernetes {what} failed: {type(exc).__name__}: {exc}") from exc
            raise

    def _serialize(self, obj: Any) -> Any:
        self._api()
        return self._client.sanitize_for_serialization(obj)

    async def _read_node(self, node: str) -> Any:
        return await self._call(f"read node {node}", "read_node", _check_name(node, "node"))

    # -- nodes ------------------------------------------------------------------------------------

    def _our_taint(self, taint: Any) -> bool:
        return bool(taint.key == self.taint_key)

    async def node_info(self, node: str) -> NodeInfo:
        return self._node_info(await self._read_node(node))

    async def list_nodes(self) -> list[NodeInfo]:
        """Every node (``GET /api/v1/nodes``), sorted by name; ``down`` is "not Ready"."""
        nodes = await self._call("list nodes", "list_node")
        return sorted((self._node_info(obj) for obj in nodes.items), key=lambda info: info.name)

    def _node_info(self, obj: Any) -> NodeInfo:
        node = str(obj.metadata.name)
        annotations = obj.metadata.annotations or {}
        unschedulable = bool(obj.spec.unschedulable)
        tainted = any(self._our_taint(t) for t in obj.spec.taints or [])
        ready = next(
            (c.status == "True" for c in (obj.status.conditions or []) if c.type == "Ready")
            if obj.status is not None
            else iter(()),
            False,
        )
        flags = ("Ready" if ready else "NotReady",) + (("SchedulingDisabled",) if unschedulable else ())
        ours = annotations.get(DRAINED_BY) == "ftd"
        return NodeInfo(
            name=node,
            state=",".join(flags),
            flags=flags,
            drained=unschedulable or tainted,
            reason=annotations.get(DRAIN_REASON) if ours else None,
            down=not ready,
        )

    async def _cordon(self, node: str, reason: str) -> None:
        for _ in range(_CONFLICT_RETRIES):
            obj = await self._read_node(node)
            annotations = obj.metadata.annotations or {}
            if annotations.get(DRAINED_BY) == "ftd":
                cordoned_by_us = annotations.get(CORDONED_BY_FTD, "true")
            else:
                cordoned_by_us = "false" if obj.spec.unschedulable else "true"
            taints = [self._serialize(t) for t in obj.spec.taints or [] if not self._our_taint(t)]
            taints.append({"key": self.taint_key, "value": reason_slug(reason), "effect": "NoSchedule"})
            body = {
                "metadata": {
                    "resourceVersion": obj.metadata.resource_version,
                    "annotations": {DRAINED_BY: "ftd", DRAIN_REASON: reason, CORDONED_BY_FTD: cordoned_by_us},
                },
                "spec": {"unschedulable": True, "taints": taints},
            }
            status = await self._call(
                f"cordon node {node}", "patch_node", node, body, ok=(409,), _content_type=MERGE_PATCH
            )
            if status != 409:
                return
        raise SchedulerError(f"node {node} kept changing while ftd tried to cordon it (409 Conflict)")

    async def drain(self, node: str, reason: str) -> None:
        reason = sanitize_reason(reason)
        await self._cordon(node, reason)
        summary: dict[str, Any] = {"node": node, "evicted": [], "blocked": [], "skipped": []}
        if self.evict:
            await self._evict_pods(node, summary)
        self.last_drain = summary
        log.info(
            "kubernetes_node_drained",
            node=node,
            reason=reason,
            evicted=len(summary["evicted"]),
            blocked=summary["blocked"],
        )

    async def cordon(self, node: str, reason: str) -> None:
        """The first half of :meth:`drain`: cordon + taint + annotations, no eviction (the
        coordinator evicts with :meth:`evict_node` once the node's jobs have saved and stopped)."""
        reason = sanitize_reason(reason)
        await self._cordon(node, reason)
        log.info("kubernetes_node_cordoned", node=node, reason=reason)

    async def evict_node(self, node: str) -> dict[str, Any]:
        """The second half of :meth:`drain`: evict the node's pods (when ``evict`` is on); returns
        the summary also kept in :attr:`last_drain`."""
        summary: dict[str, Any] = {"node": node, "evicted": [], "blocked": [], "skipped": []}
        if self.evict:
            await self._evict_pods(node, summary)
        self.last_drain = summary
        log.info(
            "kubernetes_node_evicted", node=node, evicted=len(summary["evicted"]), blocked=summary["blocked"]
        )
        return summary

    async def _evict_pods(self, node: str, summary: dict[str, Any]) -> None:
        pods = await self._call(
            f"list pods on {node}", "list_pod_for_all_namespaces", field_selector=f"spec.nodeName={node}"
        )
        for pod in pods.items:
            meta = pod.metadata
            ident = f"{meta.namespace}/{meta.name}"
            owners = meta.owner_references or []
            phase = pod.status.phase if pod.status is not None else None
            if any(o.kind == "DaemonSet" for o in owners):
                summary["skipped"].append({"pod": ident, "why": "daemonset"})
                continue
            if MIRROR_ANNOTATION in (meta.annotations or {}):
                summary["skipped"].append({"pod": ident, "why": "mirror"})
                continue
            if phase in ("Succeeded", "Failed"):
                summary["skipped"].append({"pod": ident, "why": f"finished ({phase})"})
                continue
            body = {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": meta.name, "namespace": meta.namespace},
            }
            status = await self._call(
                f"evict pod {ident}",
                "create_namespaced_pod_eviction",
                meta.name,
                meta.namespace,
                body,
                ok=(404, 429),
            )
            if status == 429:  # a PodDisruptionBudget says not now
                summary["blocked"].append(ident)
            elif status != 404:  # 404: already gone
                summary["evicted"].append(ident)

    async def resume(self, node: str) -> None:
        for _ in range(_CONFLICT_RETRIES):
            obj = await self._read_node(node)
            annotations = obj.metadata.annotations or {}
            taints = obj.spec.taints or []
            tainted = any(self._our_taint(t) for t in taints)
            if annotations.get(DRAINED_BY) != "ftd":
                if obj.spec.unschedulable:
                    raise SchedulerError(f"node {node} was cordoned, but not by ftd: leaving it alone")
                if not tainted:
                    return  # not drained: nothing to undo
            kept = [self._serialize(t) for t in taints if not self._our_taint(t)]
            spec: dict[str, Any] = {"taints": kept or None}
            if annotations.get(CORDONED_BY_FTD, "true") == "true" and annotations.get(DRAINED_BY) == "ftd":
                spec["unschedulable"] = None  # merge patch: null removes the field (= schedulable)
            body = {
                "metadata": {
                    "resourceVersion": obj.metadata.resource_version,
                    "annotations": {DRAINED_BY: None, DRAIN_REASON: None, CORDONED_BY_FTD: None},
                },
                "spec": spec,
            }
            status = await self._call(
                f"uncordon node {node}", "patch_node", node, body, ok=(409,), _content_type=MERGE_PATCH
            )
            if status != 409:
                log.info("kubernetes_node_resumed", node=node, uncordoned="unschedulable" in spec)
                return
        raise SchedulerError(f"node {node} kept changing while ftd tried to resume it (409 Conflict)")

    # -- jobs -------------------------------------------------------------------------------------

    def _selector(self, job: str) -> str:
        if not _LABEL_VALUE_RE.match(job) or not job:
            raise SchedulerError(f"invalid job id {job!r} for a Kubernetes label value")
        return f"{self.job_label}={job}"

    async def _pods_of(self, job: str) -> list[Any]:
        """The pods of ``job``: those labelled ``job_label=job``, else those a training controller
        labelled with that name (:data:`TRAINING_JOB_LABELS`, in order); [] when none."""
        self._selector(job)  # validates the id
        for label in self.job_labels:
            selector = f"{label}={job}"
            pods = await self._call(
                f"list pods of job {job}", "list_namespaced_pod", self.namespace, label_selector=selector
            )
            if pods.items:
                return list(pods.items)
        return []

    async def _job_pods(self, job: str) -> list[Any]:
        items = await self._pods_of(job)
        if not items:
            labels = ", ".join(f"{label}={job}" for label in self.job_labels)
            raise SchedulerError(f"job {job!r} not found: no pod labelled {labels}")
        return items

    async def job_info(self, job: str) -> JobInfo:
        pods = await self._job_pods(job)
        phases = [p.status.phase if p.status is not None else "Unknown" for p in pods]
        if "Running" in phases:
            state = "RUNNING"
        elif "Pending" in phases:
            state = "PENDING"
        elif "Failed" in phases:
            state = "FAILED"
        elif all(ph == "Succeeded" for ph in phases):
            state = "COMPLETED"
        else:
            state = "UNKNOWN"
        nodes = sorted({p.spec.node_name for p in pods if p.spec is not None and p.spec.node_name})
        restarts = sum(
            cs.restart_count or 0
            for p in pods
            if p.status is not None
            for cs in (p.status.container_statuses or [])
        )
        cordoned = await self._call(
            "list cordoned nodes", "list_node", field_selector="spec.unschedulable=true"
        )
        excluded = sorted(
            n.metadata.name for n in cordoned.items if any(self._our_taint(t) for t in n.spec.taints or [])
        )
        return JobInfo(job=job, state=state, nodes=tuple(nodes), excluded=tuple(excluded), restarts=restarts)

    async def job_nodes(self, job: str) -> tuple[str, ...]:
        """The ``spec.nodeName`` of the job's pods that are scheduled and not finished (phase Pending
        with a node, or Running); empty for an unknown job or an id that is not a label value."""
        if not _LABEL_VALUE_RE.match(job) or not job:
            return ()
        pods = await self._pods_of(job)
        return tuple(
            sorted(
                {
                    p.spec.node_name
                    for p in pods
                    if p.spec is not None
                    and p.spec.node_name
                    and p.metadata.deletion_timestamp is None
                    and (p.status is None or p.status.phase in ("Pending", "Running"))
                }
            )
        )

    async def job_interruptions(self, job: str) -> list[Interruption]:
        """The announced ends of ``job``'s pods (issue #37): a pod being deleted
        (``k8s_pod_deletion``) or carrying the ``DisruptionTarget`` condition (``k8s_disruption``);
        see :func:`pod_interruptions`. Empty for an unknown job or an id that is not a label value."""
        if not _LABEL_VALUE_RE.match(job) or not job:
            return []
        found: list[Interruption] = []
        for pod in await self._pods_of(job):
            found.extend(pod_interruptions(self._serialize(pod), job))
        return found

    async def pod_grace(self, job: str) -> float | None:
        """The shortest ``terminationGracePeriodSeconds`` of ``job``'s pods (the API server's 30 s where
        a pod sets none): how long the job lives after a pod's SIGTERM; None with no pod (the grace
        audit, issue #37 item 5)."""
        if not _LABEL_VALUE_RE.match(job) or not job:
            return None
        graces = []
        for pod in await self._pods_of(job):
            spec = self._serialize(pod).get("spec")
            grace = _seconds(spec.get("terminationGracePeriodSeconds")) if isinstance(spec, Mapping) else None
            graces.append(grace if grace is not None else float(DEFAULT_GRACE_S))
        return min(graces) if graces else None

    async def requeue(self, job: str, exclude: Sequence[str] = ()) -> None:
        self._selector(job)
        exclude = tuple(dict.fromkeys(exclude))
        infos = [await self.node_info(n) for n in exclude]  # unknown nodes raise before anything changes
        pods = await self._job_pods(job)
        for info in infos:
            if info.reason is None or not info.drained:
                await self._cordon(info.name, sanitize_reason(f"excluded from job {job}"))
        deleted = []
        for pod in pods:
            if pod.metadata.deletion_timestamp is not None:
                continue  # already terminating (e.g. a retried requeue)
            status = await self._call(
                f"delete pod {pod.metadata.namespace}/{pod.metadata.name}",
                "delete_namespaced_pod",
                pod.metadata.name,
                pod.metadata.namespace,
                body={"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"},
                ok=(404,),
            )
            if status != 404:
                deleted.append(pod.metadata.name)
        log.info("kubernetes_job_requeued", job=job, deleted=deleted, exclude=list(exclude))

    async def reboot(self, node: str, reason: str, nextstate: str = "RESUME") -> None:
        _check_name(node, "node")
        raise SchedulerError(
            f"cannot reboot {node}: the Kubernetes API has no node reboot (use a node-problem remedy "
            "such as a reboot DaemonSet, or drain it)"
        )


DEFAULT_GRACE_S = 30  # the API server's default terminationGracePeriodSeconds


def _k8s_time(value: object) -> float | None:
    """Epoch seconds of an RFC 3339 time as the API (or its client) writes it, else ``None``."""
    if not isinstance(value, str) or not 0 < len(value) <= 64:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    try:
        return parsed.timestamp()
    except (OverflowError, OSError, ValueError):
        return None


def _seconds(value: object) -> int | None:
    return (
        value
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 86400 * 365
        else None
    )


def pod_interruptions(pod: Mapping[str, Any], job: str) -> list[Interruption]:
    """The interruptions a pod (its JSON, camelCase as the API serves it) announces; never raises.

    * ``metadata.deletionTimestamp`` set: the pod is being deleted; the API server sets that time to
      the deletion request plus the grace period, after which the kubelet kills what still runs:
      ``k8s_pod_deletion`` with that deadline (``deletionGracePeriodSeconds`` in ``detail``);
    * a ``DisruptionTarget`` condition with status ``True`` (eviction, preemption, a taint, node
      shutdown): ``k8s_disruption``; its deadline is the deletion time when set, else the condition's
      ``lastTransitionTime`` plus ``spec.terminationGracePeriodSeconds`` (default 30 s).

    ``ref`` is the pod's uid with the kind of notice; a pod without a uid or with unreadable times
    announces nothing."""
    meta = pod.get("metadata")
    if not isinstance(meta, Mapping):
        return []
    uid, name = meta.get("uid"), meta.get("name")
    if not isinstance(uid, str) or not uid or len(uid) > 128:
        return []
    name = name if isinstance(name, str) else ""
    found: list[Interruption] = []
    deleting = _k8s_time(meta.get("deletionTimestamp"))
    grace = _seconds(meta.get("deletionGracePeriodSeconds"))
    if deleting is not None:
        found.append(
            Interruption(
                source="k8s_pod_deletion",
                deadline=deleting,
                notice_at=deleting - (grace or 0),
                job=job,
                ref=f"{uid}:deletion",
                detail=f"pod {name[:253]} deleted (grace {grace if grace is not None else '?'} s)",
            )
        )
    status, spec = pod.get("status"), pod.get("spec")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    for cond in conditions if isinstance(conditions, list) else []:
        if (
            not isinstance(cond, Mapping)
            or cond.get("type") != "DisruptionTarget"
            or cond.get("status") != "True"
        ):
            continue
        since = _k8s_time(cond.get("lastTransitionTime"))
        if since is not None:
            notice_at = since
        elif deleting is not None:
            notice_at = deleting - (grace or 0)
        else:
            continue
        pod_grace = _seconds(spec.get("terminationGracePeriodSeconds")) if isinstance(spec, Mapping) else None
        deadline = (
            deleting
            if deleting is not None
            else notice_at + (pod_grace if pod_grace is not None else DEFAULT_GRACE_S)
        )
        notice_at = min(notice_at, deadline)  # a condition stamped after the deletion time (skew)
        reason = cond.get("reason")
        found.append(
            Interruption(
                source="k8s_disruption",
                deadline=deadline,
                notice_at=notice_at,
                job=job,
                ref=f"{uid}:disruption",
                detail=f"pod {name[:253]}: {reason[:100] if isinstance(reason, str) else 'DisruptionTarget'}",
            )
        )
        break
    return found


def _api_message(exc: Any) -> str:
    """The ``message`` of a Kubernetes Status body, else the raw body (bounded)."""
    body = getattr(exc, "body", None) or ""
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    try:
        data = json.loads(body)
        if isinstance(data, dict) and data.get("message"):
            return f"{exc.status} {exc.reason}: {data['message']}"
    except (ValueError, TypeError):
        pass
    return f"{exc.status} {exc.reason}: {str(body)[:300]}"
