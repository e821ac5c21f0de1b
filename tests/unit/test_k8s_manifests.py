"""deploy/kubernetes: every manifest validates against the Kubernetes API schemas (``kubernetes-validate``,
offline: the schemas ship in the package), and the manifests say what ftd needs and no more.

- strict validation (unknown fields are errors) against the newest schema version the package has;
- the coordinator's RBAC grants exactly the (resource, verb) pairs of the Kubernetes API calls its
  executor makes (read from ftd/coordinator/actions/kubernetes.py: a new call fails this test until
  the ClusterRole/Role says so);
- the broker's ACL is deploy/mosquitto/acl, byte for byte; the daemons' TOML configs are valid ftd
  configs; the agent mounts no service-account token and tolerates every taint;
- the active/standby variant (coordinator-ha.yaml) really runs two replicas on PostgreSQL: its config
  validates with ftd's validator and names the ledger of postgres.yaml, the password comes from a
  Secret only, the replicas land on different nodes, a PodDisruptionBudget keeps one, and its probes
  answer on the leader's API and on the standby's.
"""

from __future__ import annotations

import copy
import functools
import re
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]  # dev extra, pinned: missing fails, never skips
import pytest
import yaml  # type: ignore[import-untyped]  # kubernetes-validate's own dependency

from ftd.config import parse_config

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "kubernetes"
# the base's manifests (deploy/kubernetes/base) and the alternatives, templates and examples beside it;
# the kustomizations have their own tests (test_k8s_install.py, tests/integration/test_k8s_kustomize.py)
FILES = sorted(
    (
        p
        for p in [*DEPLOY.glob("*.yaml"), *(DEPLOY / "base").glob("*.yaml")]
        if p.name != "kustomization.yaml"
    ),
    key=lambda p: p.name,
)
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
SINGLE, HA = "coordinator.yaml", "coordinator-ha.yaml"  # the coordinator: one replica, or two
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")

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


@functools.cache
def _parsed() -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for path in FILES:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((path, doc))
    return out


def docs() -> list[tuple[Path, dict[str, Any]]]:
    """Every object of deploy/kubernetes. The YAML is parsed once (it took most of this module's time,
    parsed again by every lookup); each call gets its own copy, which a test may change."""
    return copy.deepcopy(_parsed())


def by_kind(kind: str, name: str, file: str | None = None) -> dict[str, Any]:
    """The one object of that kind and name (in ``file`` when given: coordinator.yaml and
    coordinator-ha.yaml are alternatives with the same object names)."""
    found = [
        d
        for path, d in docs()
        if d["kind"] == kind and d["metadata"]["name"] == name and file in (None, path.name)
    ]
    assert len(found) == 1, f"{len(found)} {kind} {name} in {file or 'deploy/kubernetes'}"
    return found[0]


def test_the_manifests_are_all_there() -> None:
    assert [p.name for p in FILES] == [
        "agent.yaml",
        "coordinator-ha.yaml",
        "coordinator.yaml",
        "mosquitto.yaml",
        "namespace.yaml",
        "node-certs.yaml",
        "postgres.yaml",
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
            "PodDisruptionBudget",
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
    cluster = _grants(by_kind("ClusterRole", "ftd-coordinator", SINGLE)["rules"])
    namespaced = _grants(by_kind("Role", "ftd-coordinator-requeue", SINGLE)["rules"])
    assert cluster == {(r, v) for r, v, scope in CALLS.values() if scope == "cluster"}
    assert namespaced == {(r, v) for r, v, scope in CALLS.values() if scope == "namespace"}
    for rule in (
        *by_kind("ClusterRole", "ftd-coordinator", SINGLE)["rules"],
        *by_kind("Role", "ftd-coordinator-requeue", SINGLE)["rules"],
    ):
        assert rule["apiGroups"] == [""] and "*" not in rule["verbs"] and "*" not in rule["resources"]
    for file in (SINGLE, HA):
        config = parse_config(by_kind("ConfigMap", "ftd-coordinator", file)["data"]["coordinator.toml"])
        assert (
            config.coordinator.kubernetes.namespace
            == by_kind("Role", "ftd-coordinator-requeue", file)["metadata"]["namespace"]
        ), file
        assert config.coordinator.scheduler == "kubernetes", file


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
    assert paths == {"kmsg": "/dev/kmsg", "state": "/var/lib/ftd", "socket-dir": "/run/ftd"}
    # no host file for the node's certificate: a memory emptyDir the CSR init container fills
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tls"]["emptyDir"]["medium"] == "Memory"
    (init,) = pod["initContainers"]
    assert init["args"][:3] == ["agent-cert", "--out-dir", "/etc/ftd/tls"]
    assert init["securityContext"]["runAsNonRoot"] is True
    assert {m["name"]: m["mountPath"] for m in init["volumeMounts"]}["tls"] == "/etc/ftd/tls"
    node_env = {e["name"]: e for e in init["env"]}["NODE_NAME"]
    assert node_env["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    # the broker's CA: only that key of the broker's Secret (never its server key)
    assert volumes["bus-ca"]["secret"] == {
        "secretName": "ftd-broker-tls",
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }
    text = by_kind("ConfigMap", "ftd-agent")["data"]["agent.toml"].replace("@NODE@", "gpu-a017")
    config = parse_config(text)
    agent = config.agent
    assert agent.node == "gpu-a017" and agent.socket_path == "/run/ftd/agent.sock"
    assert (config.bus.cert_file, config.bus.key_file, config.bus.ca_file) == (
        "/etc/ftd/tls/gpu-a017.crt",  # where ftd agent-cert writes them (its --out-dir, <node>.crt)
        "/etc/ftd/tls/gpu-a017.key",
        "/etc/ftd/ca/ca.crt",
    )
    assert agent.kubernetes.node_conditions is True
    # its API rights: patch nodes/status (the FtdProblem condition) and create/get its node CSR,
    # bound to its account only
    assert _grants(by_kind("ClusterRole", "ftd-agent")["rules"]) == {
        ("nodes/status", "patch"),
        ("certificatesigningrequests", "create"),
        ("certificatesigningrequests", "get"),
    }
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
    # the agent's socket: the one hostPath, read-only (connect() needs no write access to the mount)
    (host,) = [v for v in pod["volumes"] if "hostPath" in v]
    assert host["hostPath"] == {"path": "/run/ftd", "type": "Directory"}
    (container,) = pod["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == host["name"]]
    assert mount == {"name": host["name"], "mountPath": "/run/ftd", "readOnly": True}
    assert "securityContext" not in container and not pod.get("hostPID")
    header = (DEPLOY / "training-job-example.yaml").read_text().split("apiVersion", 1)[0]
    assert "pod-security.kubernetes.io/enforce=privileged" in header and "SO_PEERCRED" in header


# --- the active/standby coordinators (coordinator-ha.yaml, postgres.yaml) -----------------------------


def _objects(file: str, kinds: tuple[str, ...]) -> list[dict[str, Any]]:
    return [d for path, d in docs() if path.name == file and d["kind"] in kinds]


def _keys(table: dict[str, Any], prefix: str = "") -> Any:
    """Every key of a parsed TOML document, dotted."""
    for key, value in table.items():
        yield prefix + key
        if isinstance(value, dict):
            yield from _keys(value, f"{prefix}{key}.")


def _ha_pod() -> dict[str, Any]:
    spec: dict[str, Any] = by_kind("Deployment", "ftd-coordinator", HA)["spec"]["template"]["spec"]
    return spec


def _ha_config_text() -> str:
    text: str = by_kind("ConfigMap", "ftd-coordinator", HA)["data"]["coordinator.toml"]
    return text


def test_the_ha_coordinator_has_the_same_rbac_as_the_single_one() -> None:
    # coordinator-ha.yaml replaces coordinator.yaml: its RBAC is the one checked against the executor
    # above, object for object (no Lease rights: the lease is in PostgreSQL).
    single, ha = _objects(SINGLE, RBAC_KINDS), _objects(HA, RBAC_KINDS)
    assert len(single) == 5 and ha == single
    assert "leases" not in str([d.get("rules") for d in ha])


def test_the_ha_deployment_runs_two_replicas_on_the_postgresql_ledger() -> None:
    deployment = by_kind("Deployment", "ftd-coordinator", HA)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"  # two may run: the lease decides
    config = parse_config(_ha_config_text(), source=HA)  # ftd's validator: raises on any problem
    ha = config.coordinator.ha
    assert ha.ledger == "postgresql" and ha.dsn
    assert ha.renew_interval_s < ha.lease_ttl_s
    assert ha.identity is None  # {hostname}-{pid}: unique per pod (its hostname is the pod name)
    # no SQLite ledger volume: the replicas share the database
    pod = _ha_pod()
    assert not any("persistentVolumeClaim" in v for v in pod["volumes"])
    assert not _objects(HA, ("PersistentVolumeClaim",))


def test_the_ha_config_is_rejected_by_ftd_without_its_dsn() -> None:
    # the validator used above does catch a broken HA table (so its passing means something)
    from ftd.config.errors import ConfigError

    broken = re.sub(r"(?m)^dsn = .*$", "", _ha_config_text())
    assert broken != _ha_config_text()
    with pytest.raises(ConfigError, match=r"coordinator\.ha\.dsn"):
        parse_config(broken)


def test_the_database_password_comes_from_a_secret_never_from_the_manifests() -> None:
    from psycopg.conninfo import conninfo_to_dict

    dsn = parse_config(_ha_config_text()).coordinator.ha.dsn
    assert dsn is not None
    params = conninfo_to_dict(dsn)
    assert "password" not in params
    keys = list(_keys(tomllib.loads(_ha_config_text())))
    assert "coordinator.ha.dsn" in keys and not [k for k in keys if "password" in k], keys
    (container,) = _ha_pod()["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["PGPASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "ftd-postgres", "key": "password"}
    (db,) = by_kind("StatefulSet", "ftd-postgres")["spec"]["template"]["spec"]["containers"]
    db_env = {e["name"]: e for e in db["env"]}
    secret_ref = {"name": "ftd-postgres", "key": "password"}
    assert db_env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"] == secret_ref
    for c in (container, db):  # no literal value for anything that looks like a secret
        for e in c["env"]:
            if any(word in e["name"] for word in ("PASSWORD", "SECRET", "TOKEN")):
                assert "value" not in e and "valueFrom" in e, e
    assert "password" in by_kind("Secret", "ftd-postgres")["stringData"]  # the template names the key
    # the dsn names postgres.yaml's database: its Service, port, user and database
    service = by_kind("Service", "ftd-postgres")
    assert params["host"] == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert int(str(params["port"])) == service["spec"]["ports"][0]["port"]
    assert (params["user"], params["dbname"]) == (
        db_env["POSTGRES_USER"]["value"],
        db_env["POSTGRES_DB"]["value"],
    )


def test_the_two_replicas_never_share_a_node_and_one_survives_voluntary_disruptions() -> None:
    labels = by_kind("Deployment", "ftd-coordinator", HA)["spec"]["template"]["metadata"]["labels"]
    (term,) = _ha_pod()["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= labels.items()
    pdb = by_kind("PodDisruptionBudget", "ftd-coordinator", HA)
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # one node per replica: a surge pod would find no node when only two are eligible
    rolling = by_kind("Deployment", "ftd-coordinator", HA)["spec"]["strategy"]["rollingUpdate"]
    assert (rolling["maxSurge"], rolling["maxUnavailable"]) == (0, 1)
    service = by_kind("Service", "ftd-coordinator", HA)
    assert service["spec"]["selector"].items() <= labels.items()
    (container,) = _ha_pod()["containers"]
    assert service["spec"]["ports"][0]["targetPort"] in {p["name"] for p in container["ports"]}


async def test_the_ha_probes_answer_on_the_leader_and_on_the_standby() -> None:
    # Both replicas must be Ready (the PDB and rolling updates count them): the probe's path is a
    # route of the leader's API and of the standby's, and the probe's Host header passes the leader's
    # DNS-rebinding check.
    from aiohttp.test_utils import TestClient, TestServer

    from ftd.coordinator.api import ROUTES, host_allowed
    from ftd.coordinator.ha.standby_api import StandbyApi
    from ftd.coordinator.model.leadership import HaStatus

    config = parse_config(_ha_config_text())
    (container,) = _ha_pod()["containers"]
    port = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert port["http"] == config.coordinator.api.port
    leader_routes = {(r.method, r.path) for r in ROUTES}

    def no_ledger() -> Any:
        raise AssertionError("a health probe must not need the ledger on a standby")

    standby = StandbyApi(config.coordinator.api, HaStatus(identity="pod-1", leader="pod-0"), no_ledger)
    client: TestClient[Any, Any] = TestClient(TestServer(standby.app))
    await client.start_server()
    try:
        for kind in ("readinessProbe", "livenessProbe"):
            probe = container[kind]["httpGet"]
            assert probe["port"] == "http"
            assert ("GET", probe["path"]) in leader_routes, kind
            headers = {h["name"]: h["value"] for h in probe.get("httpHeaders", [])}
            assert host_allowed(headers.get("Host"), config.coordinator.api), kind
            response = await client.get(probe["path"], headers=headers)
            assert response.status == 200, kind
            assert (await response.json())["status"] == "standby"
    finally:
        await client.close()


def test_the_bundled_postgres_is_one_documented_instance_on_a_volume() -> None:
    statefulset = by_kind("StatefulSet", "ftd-postgres")
    assert statefulset["spec"]["replicas"] == 1
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    (db,) = statefulset["spec"]["template"]["spec"]["containers"]
    assert any(m["name"] == claim["metadata"]["name"] for m in db["volumeMounts"])
    header = (DEPLOY / "postgres.yaml").read_text().split("apiVersion", 1)[0]
    assert "NOT HIGH AVAILABILITY" in header
    assert all(word in header for word in ("Patroni", "CloudNativePG", "managed"))
