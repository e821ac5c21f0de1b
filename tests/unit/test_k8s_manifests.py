"""deploy/kubernetes: every manifest validates against the Kubernetes API schemas (``kubernetes-validate``,
offline: the schemas ship in the package), and the manifests say what ftd needs and no more.

- strict validation (unknown fields are errors) against the newest schema version the package has;
- the coordinator's RBAC grants exactly the (resource, verb) pairs of the Kubernetes API calls its
  executor makes (read from ftd/coordinator/actions/kubernetes.py: a new call fails this test until
  the ClusterRole/Role says so);
- the broker's ACL is deploy/mosquitto/acl, byte for byte; the daemons' TOML configs are valid ftd
  configs; the agent mounts no service-account token and tolerates every taint.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]  # dev extra, pinned: missing fails, never skips
import pytest
import yaml  # type: ignore[import-untyped]  # kubernetes-validate's own dependency

from ftd.config import parse_config

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "kubernetes"
FILES = sorted(DEPLOY.glob("*.yaml"))
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding"}

# CoreV1Api method -> (resource, verb, scope) it needs
CALLS = {
    "read_node": ("nodes", "get", "cluster"),
    "list_node": ("nodes", "list", "cluster"),
    "patch_node": ("nodes", "patch", "cluster"),
    "list_pod_for_all_namespaces": ("pods", "list", "cluster"),
    "create_namespaced_pod_eviction": ("pods/eviction", "create", "cluster"),
    "list_namespaced_pod": ("pods", "list", "namespace"),
    "delete_namespaced_pod": ("pods", "delete", "namespace"),
}


def docs() -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for path in FILES:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((path, doc))
    return out


def by_kind(kind: str, name: str) -> dict[str, Any]:
    return next(d for _, d in docs() if d["kind"] == kind and d["metadata"]["name"] == name)


def test_the_manifests_are_all_there() -> None:
    assert [p.name for p in FILES] == [
        "agent.yaml",
        "coordinator.yaml",
        "mosquitto.yaml",
        "namespace.yaml",
        "secrets.example.yaml",
        "training-job-example.yaml",
    ]
    kinds = sorted({d["kind"] for _, d in docs()})
    assert kinds == sorted(
        {
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "DaemonSet",
            "Deployment",
            "Job",
            "Namespace",
            "PersistentVolumeClaim",
            "Role",
            "RoleBinding",
            "Secret",
            "Service",
            "ServiceAccount",
            "StatefulSet",
        }
    )


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_manifest_validates_against_the_api_schemas(path: Path) -> None:
    version = kubernetes_validate.latest_version()
    for doc in yaml.safe_load_all(path.read_text()):
        kubernetes_validate.validate(doc, version, strict=True)  # raises ValidationError


def test_an_invalid_manifest_is_caught() -> None:
    bad = by_kind("DaemonSet", "ftd-agent")
    broken = {**bad, "spec": {**bad["spec"], "selector": "app=ftd"}}  # a string where an object belongs
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, kubernetes_validate.latest_version(), strict=True)
    typo = {**bad, "spec": {**bad["spec"], "templat": {}}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(typo, kubernetes_validate.latest_version(), strict=True)


def test_namespaced_objects_live_in_ftd_system_or_the_training_namespace() -> None:
    for path, doc in docs():
        meta = doc["metadata"]
        if doc["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in meta, (path.name, meta)
        elif path.name == "training-job-example.yaml" or doc["kind"] in ("Role", "RoleBinding"):
            assert meta["namespace"] == "default", (path.name, meta)
        else:
            assert meta["namespace"] == "ftd-system", (path.name, meta)


def _grants(rules: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(res, verb) for rule in rules for res in rule["resources"] for verb in rule["verbs"]}


def test_coordinator_rbac_is_exactly_what_the_kubernetes_executor_calls() -> None:
    source = (REPO / "ftd" / "coordinator" / "actions" / "kubernetes.py").read_text()
    used = set(re.findall(r'"((?:read|list|patch|delete|create|replace)_[a-z_]+)"', source))
    assert used == set(CALLS), f"the executor calls {sorted(used)}: update CALLS and the RBAC"
    cluster = _grants(by_kind("ClusterRole", "ftd-coordinator")["rules"])
    namespaced = _grants(by_kind("Role", "ftd-coordinator-requeue")["rules"])
    assert cluster == {(r, v) for r, v, scope in CALLS.values() if scope == "cluster"}
    assert namespaced == {(r, v) for r, v, scope in CALLS.values() if scope == "namespace"}
    for rule in (
        *by_kind("ClusterRole", "ftd-coordinator")["rules"],
        *by_kind("Role", "ftd-coordinator-requeue")["rules"],
    ):
        assert rule["apiGroups"] == [""] and "*" not in rule["verbs"] and "*" not in rule["resources"]
    config = parse_config(by_kind("ConfigMap", "ftd-coordinator")["data"]["coordinator.toml"])
    assert (
        config.coordinator.kubernetes.namespace
        == by_kind("Role", "ftd-coordinator-requeue")["metadata"]["namespace"]
    )
    assert config.coordinator.scheduler == "kubernetes"


def test_the_broker_acl_is_deploy_mosquittos() -> None:
    data = by_kind("ConfigMap", "ftd-mosquitto")["data"]
    assert data["acl"] == (REPO / "deploy" / "mosquitto" / "acl").read_text()
    conf = data["mosquitto.conf"]
    assert "allow_anonymous false" in conf and "require_certificate true" in conf
    assert "use_identity_as_username true" in conf and "acl_file /mosquitto/config/acl" in conf


def test_the_agent_runs_on_every_gpu_node_and_may_only_write_its_node_condition() -> None:
    ds = by_kind("DaemonSet", "ftd-agent")
    pod = ds["spec"]["template"]["spec"]
    assert pod["tolerations"] == [{"operator": "Exists"}]  # stays on nodes ftd cordoned and tainted
    assert pod["hostPID"] is True and pod["runtimeClassName"] == "nvidia"
    paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert paths == {
        "kmsg": "/dev/kmsg",
        "state": "/var/lib/ftd",
        "socket-dir": "/run/ftd",
        "tls": "/etc/ftd/tls",
    }
    text = by_kind("ConfigMap", "ftd-agent")["data"]["agent.toml"].replace("@NODE@", "gpu-a017")
    agent = parse_config(text).agent
    assert agent.node == "gpu-a017" and agent.socket_path == "/run/ftd/agent.sock"
    assert agent.kubernetes.node_conditions is True
    # its only API right: patch nodes/status (the FtdProblem condition), bound to its account only
    assert _grants(by_kind("ClusterRole", "ftd-agent")["rules"]) == {("nodes/status", "patch")}
    bound = [
        d["roleRef"]["name"]
        for _, d in docs()
        if d["kind"].endswith("Binding") and any(s["name"] == "ftd-agent" for s in d["subjects"])
    ]
    assert bound == ["ftd-agent"]
    source = (REPO / "ftd" / "agent" / "node_conditions.py").read_text()
    assert "/api/v1/nodes/{self.node}/status" in source and "session.patch" in source


def test_the_training_job_is_recreated_when_ftd_stops_it() -> None:
    from ftd.client import STOP_EXIT_CODE

    job = by_kind("Job", "train-llm")
    (rule,) = job["spec"]["podFailurePolicy"]["rules"]
    assert rule["action"] == "Ignore" and rule["onExitCodes"]["values"] == [STOP_EXIT_CODE]
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"  # podFailurePolicy needs it
    assert job["spec"]["template"]["metadata"]["labels"]["ftd.dev/job"] == "train-llm"
