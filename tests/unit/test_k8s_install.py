"""deploy/kubernetes as one install: the image recipe, the kustomize base and overlay, the CSR RBAC.

There is no container runtime and no kustomize or kubectl here, so these are static checks:

- the Containerfile (parsed): one Debian-based python:3.11-slim stage; every COPY source is in the
  repository or is the wheel `make dist` writes (the Makefile's dist target, the project's normalized
  name, not the client's wheel); the extras installed are those the shipped configs need; wheels only
  (no compiler); openssl is the only Debian package; ENTRYPOINT is the `ftd` console script and each
  manifest container of the image runs an ftd sub-command; the default user is not root;
- the kustomize base lists exactly the one-step install's manifests, all present; the example overlay's
  `images:` names an image of the base, every patch target exists once, and the overlay rendered here
  in Python (image override, strategic-merge patches of the config maps, JSON-6902 replace ops: what the
  overlay uses, and the renderer refuses anything else) validates strictly against the API schemas; the
  rendered configs are valid ftd configs, agree on the training namespace with the Role, and differ
  from the base's only in the site values. kustomize itself was not run (README.md says so);
- the node-certificate RBAC is exactly the CSR calls ftd agent-cert and ftd cert-signer make, and
  the `signers` grant names ftd's signer only.
"""

from __future__ import annotations

import copy
import fnmatch
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml  # type: ignore[import-untyped]

from ftd.cli import build_parser
from ftd.config import parse_config

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "kubernetes"
OVERLAY = DEPLOY / "overlays" / "example"
IMAGE = "registry.example.internal/ftd"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


# --- the Containerfile ------------------------------------------------------------------------------


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of deploy/kubernetes/Containerfile, continuation lines joined."""
    text = (DEPLOY / "Containerfile").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _one(word: str) -> str:
    found = [args for w, args in instructions() if w == word]
    assert len(found) == 1, f"{len(found)} {word} instructions"
    return found[0]


def _wheel_name() -> str:
    """The wheel of ftd-daemon as `make dist` writes it (PEP 427: the name's - and . become _)."""
    dist = re.search(r"^dist:.*?\n((?:\t.*\n)+)", (REPO / "Makefile").read_text(), flags=re.M)
    assert dist and "-m build" in dist.group(1) and "--outdir dist ." in dist.group(1)
    version = re.search(r'__version__ = "([^"]+)"', (REPO / "ftd" / "__init__.py").read_text())
    assert version
    name = re.sub(r"[-_.]+", "_", PYPROJECT["project"]["name"])
    return f"dist/{name}-{version.group(1)}-py3-none-any.whl"


def _container_images() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            pod = ((doc or {}).get("spec") or {}).get("template", {}).get("spec")
            if pod:
                for c in [*pod.get("initContainers", []), *pod["containers"]]:
                    out.append((f"{path.name}:{c['name']}", c))
    return out


def test_the_image_is_python_3_11_slim_and_runs_ftd() -> None:
    assert _one("FROM") == "docker.io/library/python:3.11-slim"
    assert _one("ENTRYPOINT") == '["ftd"]'
    assert PYPROJECT["project"]["scripts"]["ftd"] == "ftd.cli:main"  # the console script
    user = _one("USER")
    assert user.split(":")[0] not in ("0", "root")


def test_every_copy_source_is_in_the_repository_or_made_by_make_dist() -> None:
    copies = [shlex.split(args) for word, args in instructions() if word == "COPY"]
    assert copies
    wheel = _wheel_name()
    client = re.sub(
        r"[-_.]+",
        "_",
        tomllib.loads((REPO / "packaging/client/pyproject.toml").read_text())["project"]["name"],
    )
    for *sources, _dest in copies:
        for source in sources:
            if source.startswith("dist/"):
                assert fnmatch.fnmatch(wheel, source), (source, wheel)
                assert not fnmatch.fnmatch(f"dist/{client}-0.1.0-py3-none-any.whl", source), source
            else:
                assert list(REPO.glob(source)), f"COPY {source}: not in the repository"


def _installed_extras() -> set[str]:
    run = " ".join(args for word, args in instructions() if word == "RUN")
    match = re.search(r'pip install ([^;]*?)"\$\{wheel\}\[([a-z0-9,]+)\]"', run)
    assert match, "the RUN that pip-installs the wheel with its extras"
    options = match.group(1).split()
    assert "--only-binary=:all:" in options and "--no-cache-dir" in options  # wheels only, no cache kept
    return set(match.group(2).split(","))


def _configs() -> list[Any]:
    out = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["kind"] == "ConfigMap":
                for key, text in doc["data"].items():
                    if key.endswith(".toml"):
                        out.append(
                            parse_config(text.replace("@NODE@", "gpu-a017"), source=f"{path.name}:{key}")
                        )
    return out


def test_the_extras_installed_are_the_ones_the_shipped_configs_need() -> None:
    needed = {"daemon"}
    for config in _configs():
        if config.coordinator.scheduler == "kubernetes":
            needed.add("k8s")
        if config.coordinator.ha.ledger == "postgresql":
            needed.add("ha")
    assert _installed_extras() == needed == {"daemon", "k8s", "ha"}
    assert needed <= set(PYPROJECT["project"]["optional-dependencies"])


def test_no_build_tool_is_installed_and_apt_lists_are_removed() -> None:
    run = " ".join(args for word, args in instructions() if word == "RUN")
    installs = re.findall(r"apt-get install ((?:-\S+ )*)([^&;]+)", run)
    assert installs and all("--no-install-recommends" in flags for flags, _ in installs)
    packages = {p for _, names in installs for p in names.split()}
    assert packages == {"openssl"}  # ftd agent-cert and cert-signer run it
    assert "rm -rf /var/lib/apt/lists/*" in run
    assert not re.search(r"\b(gcc|g\+\+|make|build-essential|[a-z0-9]+-dev)\b", run)


def test_every_container_of_the_image_runs_an_ftd_sub_command() -> None:
    commands = set(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    ours = [(where, c) for where, c in _container_images() if c["image"].startswith(IMAGE)]
    assert len(ours) == 5  # coordinator (x2 files), the signer, the agent and its init container
    for where, c in ours:
        if "command" in c:  # the agent: a shell that renders its config, then exec ftd agent
            assert c["command"] == ["/bin/sh", "-c"] and "exec ftd agent " in c["args"][0], where
        else:
            assert c["args"][0] in commands, where
        security = c.get("securityContext", {})
        if security.get("runAsUser") == 0:
            assert where == "agent.yaml:agent" and security["privileged"] is True  # /dev/kmsg


# --- kustomize ---------------------------------------------------------------------------------------


def _kustomization(directory: Path) -> dict[str, Any]:
    k: dict[str, Any] = yaml.safe_load((directory / "kustomization.yaml").read_text())
    assert k["apiVersion"] == "kustomize.config.k8s.io/v1beta1" and k["kind"] == "Kustomization"
    unsupported = set(k) - {"apiVersion", "kind", "resources", "images", "patches"}
    assert not unsupported, f"this test's renderer does not do {unsupported}: extend it first"
    return k


def _find(docs: list[dict[str, Any]], target: dict[str, Any]) -> dict[str, Any]:
    found = [
        d
        for d in docs
        if d["kind"] == target["kind"]
        and d["metadata"]["name"] == target["name"]
        and target.get("namespace") in (None, d["metadata"].get("namespace"))
    ]
    assert len(found) == 1, f"patch target {target}: {len(found)} objects"
    return found[0]


def _pointer(doc: dict[str, Any], path: str) -> tuple[Any, str]:
    parts = [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")]
    node: Any = doc
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node, parts[-1]


def _strategic_merge(target: Any, patch: Any) -> Any:
    """Maps merge key by key; anything else replaces (the overlay patches maps only: asserted)."""
    if not isinstance(patch, dict):
        assert not isinstance(patch, list), "list merges are not rendered by this test"
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        out[key] = _strategic_merge(out.get(key), value)
    return out


def render(directory: Path) -> list[dict[str, Any]]:
    k = _kustomization(directory)
    docs: list[dict[str, Any]] = []
    for resource in k["resources"]:
        path = (directory / resource).resolve()
        assert path.exists(), f"{directory}: resource {resource} does not exist"
        if path.is_dir():
            docs += render(path)
        else:
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    for image in k.get("images", []):
        containers = [
            c
            for d in docs
            for c in [
                *d.get("spec", {}).get("template", {}).get("spec", {}).get("initContainers", []),
                *d.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []),
            ]
            if re.split(r"[:@]", c["image"].rsplit("/", 1)[-1])[0] == image["name"].rsplit("/", 1)[-1]
            and c["image"].rsplit("/", 1)[0] == image["name"].rsplit("/", 1)[0]
        ]
        assert containers, f"images: {image['name']} is no image of the manifests"
        for c in containers:
            c["image"] = f"{image.get('newName', image['name'])}:{image['newTag']}"
    for patch in k.get("patches", []):
        if "path" in patch:
            body = yaml.safe_load((directory / patch["path"]).read_text())
            meta = body["metadata"]
            target = _find(
                docs, {"kind": body["kind"], "name": meta["name"], "namespace": meta.get("namespace")}
            )
            merged = _strategic_merge(target, body)
            target.clear()
            target.update(merged)
        else:
            target = _find(docs, patch["target"])
            for op in yaml.safe_load(patch["patch"]):
                assert op["op"] in ("replace", "add"), op
                parent, key = _pointer(target, op["path"])
                if op["op"] == "replace":
                    assert key in parent, f"replace of a missing {op['path']}"
                parent[key] = op["value"]
    return docs


BASE_FILES = ["namespace.yaml", "mosquitto.yaml", "coordinator.yaml", "node-certs.yaml", "agent.yaml"]


def test_the_base_lists_the_one_step_install() -> None:
    assert _kustomization(DEPLOY)["resources"] == BASE_FILES
    for name in BASE_FILES:
        assert (DEPLOY / name).is_file()
    # the rest are alternatives, templates and examples, named as such in the base's header
    header = (DEPLOY / "kustomization.yaml").read_text().split("apiVersion", 1)[0]
    others = {p.name for p in DEPLOY.glob("*.yaml")} - {*BASE_FILES, "kustomization.yaml"}
    assert others == {
        "secrets.example.yaml",
        "coordinator-ha.yaml",
        "postgres.yaml",
        "training-job-example.yaml",
    }
    assert all(name in header for name in others)


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    return render(OVERLAY)


def test_the_rendered_overlay_validates_against_the_api_schemas(rendered: list[dict[str, Any]]) -> None:
    version = kubernetes_validate.latest_version()
    assert len(rendered) == len(render(DEPLOY))
    for doc in rendered:
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_overlay_sets_the_sites_image_everywhere(rendered: list[dict[str, Any]]) -> None:
    (image,) = _kustomization(OVERLAY)["images"]
    assert image["name"] == IMAGE
    wanted = f"{image['newName']}:{image['newTag']}"
    images = [
        c["image"]
        for d in rendered
        for c in [
            *d.get("spec", {}).get("template", {}).get("spec", {}).get("initContainers", []),
            *d.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []),
        ]
    ]
    assert images.count(wanted) == 4 and not [i for i in images if i.startswith(IMAGE)]


def _config_of(docs: list[dict[str, Any]], name: str, key: str) -> str:
    text: str = _find(docs, {"kind": "ConfigMap", "name": name})["data"][key]
    return text


def _flat(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[prefix + key] = value
    return out


SITE_KEYS = {"bus.host", "bus.port", "coordinator.kubernetes.namespace"}


def test_the_rendered_configs_are_valid_and_agree_with_the_rbac(rendered: list[dict[str, Any]]) -> None:
    coordinator = parse_config(_config_of(rendered, "ftd-coordinator", "coordinator.toml"))
    agent = parse_config(_config_of(rendered, "ftd-agent", "agent.toml").replace("@NODE@", "gpu-a017"))
    training = coordinator.coordinator.kubernetes.namespace
    assert training == "ml-training"
    for kind in ("Role", "RoleBinding"):
        assert (
            _find(rendered, {"kind": kind, "name": "ftd-coordinator-requeue"})["metadata"]["namespace"]
            == training
        )
    assert (agent.bus.host, agent.bus.port) == (coordinator.bus.host, coordinator.bus.port)
    # only the site values differ from the base's configs (the overlay's copies do not drift)
    base = render(DEPLOY)
    for name, key in (("ftd-coordinator", "coordinator.toml"), ("ftd-agent", "agent.toml")):
        mine = _flat(tomllib.loads(_config_of(rendered, name, key)))
        theirs = _flat(tomllib.loads(_config_of(base, name, key)))
        assert set(mine) == set(theirs), name
        assert {k for k in mine if mine[k] != theirs[k]} <= SITE_KEYS, name


def test_a_patch_with_a_missing_target_is_caught(tmp_path: Path) -> None:
    site = tmp_path / "deploy" / "kubernetes" / "overlays" / "site"
    site.mkdir(parents=True)
    for p in DEPLOY.glob("*.yaml"):
        (tmp_path / "deploy" / "kubernetes" / p.name).write_text(p.read_text())
    k = yaml.safe_load((OVERLAY / "kustomization.yaml").read_text())
    k["patches"] = [{"target": {"kind": "Role", "name": "ftd-requeue"}, "patch": "[]"}]
    (site / "kustomization.yaml").write_text(yaml.safe_dump(k))
    with pytest.raises(AssertionError, match="patch target"):
        render(site)
    k["patches"], k["images"] = [], [{"name": "registry.example.internal/ftd-typo", "newTag": "1"}]
    (site / "kustomization.yaml").write_text(yaml.safe_dump(k))
    with pytest.raises(AssertionError, match="is no image"):
        render(site)


# --- the node-certificate RBAC -----------------------------------------------------------------------

# CsrClient method -> (resource, verb) it needs
CSR_CALLS = {
    "create": ("certificatesigningrequests", "create"),
    "get": ("certificatesigningrequests", "get"),
    "list": ("certificatesigningrequests", "list"),
    "update_approval": ("certificatesigningrequests/approval", "update"),
    "update_status": ("certificatesigningrequests/status", "update"),
}


def _calls(module: str) -> set[str]:
    source = (REPO / "ftd" / "commands" / "node_certs" / module).read_text()
    return set(re.findall(r"client\.(create|get|list|update_approval|update_status)\(", source))


def _rules(file: str, role: str) -> list[dict[str, Any]]:
    for doc in yaml.safe_load_all((DEPLOY / file).read_text()):
        if doc and doc["kind"] == "ClusterRole" and doc["metadata"]["name"] == role:
            rules: list[dict[str, Any]] = doc["rules"]
            return rules
    raise AssertionError(role)


def test_the_csr_rbac_is_exactly_what_agent_cert_and_cert_signer_call() -> None:
    agent_calls, signer_calls = _calls("request.py"), _calls("signer.py")
    assert agent_calls == {"create", "get"} and signer_calls == {"list", "update_approval", "update_status"}
    agent = {
        (res, verb)
        for rule in _rules("agent.yaml", "ftd-agent")
        if rule["apiGroups"] == ["certificates.k8s.io"]
        for res in rule["resources"]
        for verb in rule["verbs"]
    }
    assert agent == {CSR_CALLS[c] for c in agent_calls}
    signer_rules = _rules("node-certs.yaml", "ftd-cert-signer")
    assert all(rule["apiGroups"] == ["certificates.k8s.io"] for rule in signer_rules)
    signer = {
        (res, verb)
        for rule in signer_rules
        if "signers" not in rule["resources"]
        for res in rule["resources"]
        for verb in rule["verbs"]
    }
    assert signer == {CSR_CALLS[c] for c in signer_calls}
    (signers,) = [rule for rule in signer_rules if "signers" in rule["resources"]]
    from ftd.commands.node_certs.review import SIGNER

    assert signers == {
        "apiGroups": ["certificates.k8s.io"],
        "resources": ["signers"],
        "resourceNames": [SIGNER],
        "verbs": ["approve", "sign"],
    }


def test_only_the_signer_mounts_the_node_ca_and_checks_the_agents_account() -> None:
    mounts = [
        (where, v)
        for path in sorted(DEPLOY.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc.get("spec", {}).get("template")
        for where in [f"{path.name}:{doc['metadata']['name']}"]
        for v in doc["spec"]["template"]["spec"].get("volumes", [])
        if v.get("secret", {}).get("secretName") == "ftd-node-ca"
    ]
    assert [where for where, _ in mounts] == ["node-certs.yaml:ftd-cert-signer"]
    deployment = next(
        d for d in yaml.safe_load_all((DEPLOY / "node-certs.yaml").read_text()) if d["kind"] == "Deployment"
    )
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = dict(a.removeprefix("--").split("=", 1) for a in container["args"][1:])
    agent_sa = next(
        d for d in yaml.safe_load_all((DEPLOY / "agent.yaml").read_text()) if d["kind"] == "ServiceAccount"
    )
    assert (args["agent-namespace"], args["agent-service-account"]) == (
        agent_sa["metadata"]["namespace"],
        agent_sa["metadata"]["name"],
    )
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "ftd-cert-signer"
