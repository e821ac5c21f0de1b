"""deploy/kubernetes as one install: the image recipe, the kustomize base and overlay, the CSR RBAC.

There is no container runtime here, so these are static checks:

- the Containerfile (parsed): one Debian-based python:3.11-slim stage; every COPY source is in the
  repository or is the wheel `make dist` writes (the Makefile's dist target, the project's normalized
  name, not the client's wheel); the extras installed are those the shipped configs need; wheels only
  (no compiler); openssl is the only Debian package; ENTRYPOINT is the `ftd` console script and each
  manifest container of the image runs an ftd sub-command; the default user is not root;
- the kustomize base (deploy/kubernetes/base) lists exactly the one-step install's manifests, all
  present, and no overlay lives inside it; what kustomize builds from it and from every documented
  overlay is checked with the real kubectl in tests/integration/test_k8s_kustomize.py;
- the node-certificate RBAC is exactly the CSR calls ftd agent-cert and ftd cert-signer make, and
  the `signers` grant names ftd's signer only.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]

from ftd.cli import build_parser
from ftd.config import parse_config

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "kubernetes"
BASE = DEPLOY / "base"
# every manifest: the base's and the alternatives, templates and examples beside it
MANIFESTS = sorted(
    p for p in [*DEPLOY.glob("*.yaml"), *BASE.glob("*.yaml")] if p.name != "kustomization.yaml"
)
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
    assert dist and "-m build" in dist.group(1) and "--outdir $(DIST) ." in dist.group(1)
    assert re.search(r"^DIST\s*\?=\s*dist$", (REPO / "Makefile").read_text(), flags=re.M)  # by default
    version = re.search(r'__version__ = "([^"]+)"', (REPO / "ftd" / "__init__.py").read_text())
    assert version
    name = re.sub(r"[-_.]+", "_", PYPROJECT["project"]["name"])
    return f"dist/{name}-{version.group(1)}-py3-none-any.whl"


def _container_images() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in MANIFESTS:
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
    for path in MANIFESTS:
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
# The base's file list, statically; what kustomize builds from the base and the overlays (and that it
# builds at all) is tests/integration/test_k8s_kustomize.py's, with the real kubectl.


BASE_FILES = ["namespace.yaml", "mosquitto.yaml", "coordinator.yaml", "node-certs.yaml", "agent.yaml"]


def test_the_base_lists_the_one_step_install() -> None:
    k = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    assert k["resources"] == BASE_FILES
    assert {p.name for p in BASE.glob("*.yaml")} == {*BASE_FILES, "kustomization.yaml"}
    # the rest are alternatives, templates and examples, beside the base and named in its header
    header = (BASE / "kustomization.yaml").read_text().split("apiVersion", 1)[0]
    others = {p.name for p in DEPLOY.glob("*.yaml")}
    assert others == {
        "secrets.example.yaml",
        "coordinator-ha.yaml",
        "postgres.yaml",
        "training-job-example.yaml",
    }
    assert all(name in header for name in others)


def test_no_overlay_lives_inside_the_base() -> None:
    """kustomize refuses an overlay under the kustomization it builds on ("cycle detected", #32)."""
    for kustomization in DEPLOY.rglob("kustomization.yaml"):
        if kustomization.parent != BASE:
            assert BASE not in kustomization.parents, kustomization
            assert kustomization.parent.parent == DEPLOY / "overlays", kustomization


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
    for doc in yaml.safe_load_all((BASE / file).read_text()):
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
        for path in MANIFESTS
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc.get("spec", {}).get("template")
        for where in [f"{path.name}:{doc['metadata']['name']}"]
        for v in doc["spec"]["template"]["spec"].get("volumes", [])
        if v.get("secret", {}).get("secretName") == "ftd-node-ca"
    ]
    assert [where for where, _ in mounts] == ["node-certs.yaml:ftd-cert-signer"]
    deployment = next(
        d for d in yaml.safe_load_all((BASE / "node-certs.yaml").read_text()) if d["kind"] == "Deployment"
    )
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = dict(a.removeprefix("--").split("=", 1) for a in container["args"][1:])
    agent_sa = next(
        d for d in yaml.safe_load_all((BASE / "agent.yaml").read_text()) if d["kind"] == "ServiceAccount"
    )
    assert (args["agent-namespace"], args["agent-service-account"]) == (
        agent_sa["metadata"]["namespace"],
        agent_sa["metadata"]["name"],
    )
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "ftd-cert-signer"
