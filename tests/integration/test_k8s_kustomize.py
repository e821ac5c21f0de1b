"""Every kustomize overlay the docs name builds with the real ``kubectl kustomize``, and what it builds is
a valid install (issue #32 item 1: the documented overlay lived inside its own base, and kustomize
refused it as a cycle, which no test noticed because none ran kustomize).

The overlays come from the docs themselves (README.md, docs/, deploy/**/README.md: every
``overlays/<name>`` they mention), so a newly documented overlay is built here without touching this
file; a documented overlay that does not exist, or an overlay directory no doc names, fails. For each:

- ``kubectl kustomize`` exits 0 and says nothing on stderr but the deprecation warnings of the fields
  the overlay uses so that Debian's kubectl (``kubernetes-client`` 1.20, kustomize 2.0) builds it too;
- every object parses, has ``apiVersion``, ``kind`` and ``metadata.name``, and validates **strictly**
  (unknown fields are errors; an unknown kind has no schema and fails) against the Kubernetes API
  schemas ``kubernetes-validate`` ships, offline. ``kubectl create --dry-run=client --validate`` is not
  used: it downloads the schemas from an API server, and there is none here;
- it holds the base's objects, no more and no fewer, each once;
- the site's values land: the image override on every ftd container, the training namespace of the
  coordinator's config on its requeue Role and RoleBinding (a JSON 6902 patch whose target no longer
  matches is silently skipped by kustomize: this catches it), the same broker in both configs, and the
  rendered configs are valid ftd configs that differ from the base's only in the site values.

A copy of the example next to it (``overlays/<site>``, what the docs tell a site to make) builds too.
kubectl missing: skipped locally, failed under ``FTD_REQUIRE_REAL=1`` (``make test`` installs it).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml  # type: ignore[import-untyped]

from ftd.config import parse_config
from tests.realparts import require_binary

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "kubernetes"
BASE = DEPLOY / "base"
OVERLAYS = DEPLOY / "overlays"
IMAGE = "registry.example.internal/ftd"  # the image name the base's manifests use
SITE_KEYS = {"bus.host", "bus.port", "coordinator.kubernetes.namespace"}
# What newer kubectl says about the fields kept for Debian's kustomize 2.0 (the overlay's comment).
DEPRECATED = re.compile(
    r"# Warning: '(bases|patchesStrategicMerge|patchesJson6902)' is deprecated\. Please use "
    r"'(resources|patches)' instead\. Run 'kustomize edit fix' to update your Kustomization automatically\."
)

pytestmark = pytest.mark.real


def _doc_files() -> list[Path]:
    return sorted({REPO / "README.md", *(REPO / "docs").rglob("*.md"), *(REPO / "deploy").rglob("*.md")})


def documented_overlays() -> list[str]:
    """Every overlay name the docs mention (``overlays/<site>`` placeholders are no name)."""
    names = set()
    for path in _doc_files():
        names |= set(re.findall(r"\boverlays/([A-Za-z0-9][A-Za-z0-9._-]*)", path.read_text()))
    return sorted(names)


def test_the_docs_name_overlays_and_every_overlay_is_documented() -> None:
    named = documented_overlays()
    assert "example" in named  # the one docs/operators.md §2 and deploy/kubernetes/README.md apply
    existing = sorted(p.name for p in OVERLAYS.iterdir() if p.is_dir())
    assert named == existing, f"documented {named}, present {existing}"


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize <directory>``'s objects; a failure or an unexpected warning fails the test."""
    kubectl = require_binary("kubectl", package="kubernetes-client")
    done = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, f"kubectl kustomize {directory}: {done.stderr}"
    unexpected = [
        line for line in done.stderr.splitlines() if line.strip() and not DEPRECATED.fullmatch(line)
    ]
    assert not unexpected, f"kubectl kustomize {directory} warned: {unexpected}"
    objects = [doc for doc in yaml.safe_load_all(done.stdout) if doc is not None]
    assert objects, f"kubectl kustomize {directory} built nothing"
    return objects


def _key(obj: dict[str, Any]) -> tuple[str, str, str, str]:
    meta = obj["metadata"]
    return (obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])


def validate(objects: list[dict[str, Any]]) -> None:
    version = kubernetes_validate.latest_version()
    for obj in objects:
        assert isinstance(obj, dict), obj
        assert obj.get("apiVersion") and obj.get("kind"), obj
        assert (obj.get("metadata") or {}).get("name"), f"{obj['kind']} without metadata.name"
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            pytest.fail(f"{obj['apiVersion']} {obj['kind']}: no such kind in Kubernetes {version}")


def _find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind} {name}"
    return found[0]


def _containers(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for obj in objects:
        pod = obj.get("spec", {}).get("template", {}).get("spec", {})
        out += [*pod.get("initContainers", []), *pod.get("containers", [])]
    return out


def _flat(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[prefix + key] = value
    return out


def _config(objects: list[dict[str, Any]], name: str, key: str) -> str:
    text: str = _find(objects, "ConfigMap", name)["data"][key]
    return text


@pytest.fixture(scope="module")
def base() -> list[dict[str, Any]]:
    return kustomize(BASE)


def check_site(directory: Path, objects: list[dict[str, Any]], base: list[dict[str, Any]]) -> None:
    """The overlay in ``directory`` built ``objects``: a valid install carrying its site values."""
    validate(objects)
    keys = [_key(o) for o in objects]
    assert len(keys) == len(set(keys)), "an object twice"
    moved = {("Role", "ftd-coordinator-requeue"), ("RoleBinding", "ftd-coordinator-requeue")}
    assert {k for k in keys if (k[1], k[3]) not in moved} == {
        _key(o) for o in base if (o["kind"], o["metadata"]["name"]) not in moved
    }, "the overlay's objects are not the base's"

    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    (image,) = kustomization["images"]
    assert image["name"] == IMAGE
    wanted = f"{image.get('newName', IMAGE)}:{image['newTag']}"
    images = [c["image"] for c in _containers(objects)]
    assert images.count(wanted) == 4, images  # coordinator, signer, the agent and its init container
    assert not [i for i in images if i.startswith(IMAGE)], images

    coordinator = parse_config(_config(objects, "ftd-coordinator", "coordinator.toml"))
    agent_text = _config(objects, "ftd-agent", "agent.toml").replace("@NODE@", "gpu-a017")
    agent = parse_config(agent_text)
    training = coordinator.coordinator.kubernetes.namespace
    for kind in ("Role", "RoleBinding"):
        assert _find(objects, kind, "ftd-coordinator-requeue")["metadata"]["namespace"] == training, kind
    assert (agent.bus.host, agent.bus.port) == (coordinator.bus.host, coordinator.bus.port)
    for name, key in (("ftd-coordinator", "coordinator.toml"), ("ftd-agent", "agent.toml")):
        mine = _flat(tomllib.loads(_config(objects, name, key)))
        theirs = _flat(tomllib.loads(_config(base, name, key)))
        assert set(mine) == set(theirs), f"{name}: keys differ from the base's"
        assert {k for k in mine if mine[k] != theirs[k]} <= SITE_KEYS, name


def test_the_base_builds_and_validates(base: list[dict[str, Any]]) -> None:
    validate(base)
    kinds = {o["kind"] for o in base}
    assert {"Namespace", "StatefulSet", "Deployment", "DaemonSet", "ConfigMap", "ClusterRole"} <= kinds


@pytest.mark.parametrize("name", documented_overlays())
def test_every_documented_overlay_builds_into_a_valid_install(name: str, base: list[dict[str, Any]]) -> None:
    directory = OVERLAYS / name
    assert (directory / "kustomization.yaml").is_file(), f"the docs name overlays/{name}: not there"
    check_site(directory, kustomize(directory), base)


def test_the_example_values_reach_the_install(base: list[dict[str, Any]]) -> None:
    objects = kustomize(OVERLAYS / "example")
    assert _find(objects, "Role", "ftd-coordinator-requeue")["metadata"]["namespace"] == "ml-training"
    assert "registry.example.org/ml-infra/ftd:0.1.0" in [c["image"] for c in _containers(objects)]


def _tree_copy(tmp_path: Path) -> Path:
    """deploy/kubernetes copied under tmp_path (its base and overlays as a site has them)."""
    target = tmp_path / "deploy" / "kubernetes"
    shutil.copytree(DEPLOY, target)
    return target


def test_a_sites_copy_of_the_example_next_to_it_builds(tmp_path: Path, base: list[dict[str, Any]]) -> None:
    tree = _tree_copy(tmp_path)
    site = tree / "overlays" / "gpu-east"
    shutil.copytree(tree / "overlays" / "example", site)
    for file in ("coordinator-config.yaml", "training-namespace.yaml"):
        path = site / file
        path.write_text(path.read_text().replace("ml-training", "research"))
    objects = kustomize(site)
    check_site(site, objects, base)
    assert _find(objects, "RoleBinding", "ftd-coordinator-requeue")["metadata"]["namespace"] == "research"


def test_a_patch_that_misses_its_target_is_caught(tmp_path: Path, base: list[dict[str, Any]]) -> None:
    """The check is not vacuous: a site that moves only the config's namespace (the Role patch left
    at the old one) builds without a word from kustomize, and check_site fails it."""
    tree = _tree_copy(tmp_path)
    site = tree / "overlays" / "example"
    path = site / "coordinator-config.yaml"
    path.write_text(path.read_text().replace("ml-training", "research"))
    with pytest.raises(AssertionError, match="Role"):
        check_site(site, kustomize(site), base)


def test_an_overlay_inside_its_base_is_refused(tmp_path: Path) -> None:
    """The layout #32 found broken (an overlay under the kustomization it builds on) fails here: the
    helper reports kustomize's error instead of passing."""
    tree = _tree_copy(tmp_path)
    nested = tree / "base" / "overlays" / "example"
    shutil.copytree(tree / "overlays" / "example", nested)
    kustomization = nested / "kustomization.yaml"
    kustomization.write_text(kustomization.read_text().replace("- ../../base", "- ../.."))
    with pytest.raises(AssertionError, match="kubectl kustomize"):
        kustomize(nested)
