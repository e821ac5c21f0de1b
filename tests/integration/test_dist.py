"""``make dist`` builds both distributions with the build tools alone, and the client's wheel installs
by itself (issue #32 item 7).

The docs install from what exists (the wheels ``make dist`` writes, or a checkout), since neither
``ftd-daemon`` nor ``ftd-daemon-client`` is on PyPI. ``make dist`` used to depend on the full stamp, so
the image recipe's first step installed torch, Lightning and Transformers (1.8 GB) to build a wheel of
under 1 MB; it now depends on a stamp that installs ``build`` and ``hatchling`` only:

- ``make -n dist`` on a venv that does not exist yet shows what it would install: build and hatchling,
  nothing else (no extra, no torch);
- ``make dist`` (its build stamp taken as made: this venv has both tools, and a test must not install
  anything) writes the wheel and sdist of ftd-daemon and of ftd-daemon-client, named by the projects'
  metadata and version, into a directory of the test's (``DIST=``);
- the client's wheel installs into a fresh venv without any package index (``--no-index``: it needs
  nothing else) and ``ftd.client`` and ``ftd.supervisor`` import from it, outside the checkout, while
  the daemons' packages are not there.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.realparts import require_binary

REPO = Path(__file__).resolve().parents[2]
VENV = Path(sys.prefix)  # the venv running the tests: the one `make` would use
HEAVY = re.compile(r"torch|lightning|transformers|\[dev|\[all|-e ")


def _make(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    make = require_binary("make", package="make")
    return subprocess.run(
        [make, "--no-print-directory", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_make_dist_installs_the_build_tools_only(tmp_path: Path) -> None:
    done = _make("-n", "dist", f"VENV={tmp_path / 'venv'}", f"DIST={tmp_path / 'dist'}")
    assert done.returncode == 0, done.stderr
    installs = [line for line in done.stdout.splitlines() if " -m pip install " in line]
    assert installs, done.stdout
    heavy = [line for line in installs if HEAVY.search(line)]
    assert not heavy, f"make dist installs more than the build tools: {heavy}"
    packages = {
        re.split(r"[<>=!~ ]", word, maxsplit=1)[0]
        for line in installs
        for word in shlex.split(line.split(" -m pip install ", 1)[1])
        if not word.startswith("-") and word != "constraints/test.txt"
    }
    assert packages == {"pip", "build", "hatchling"}, installs  # pip: the venv's own upgrade


def _name_and_version(pyproject: Path) -> tuple[str, str]:
    name = tomllib.loads(pyproject.read_text())["project"]["name"]
    version = re.search(r'__version__ = "([^"]+)"', (REPO / "ftd" / "__init__.py").read_text())
    assert version
    return re.sub(r"[-_.]+", "_", name), version.group(1)


def test_make_dist_builds_both_and_the_client_wheel_installs_alone(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    stamp = VENV / ".ftd-build-installed"
    done = _make("dist", f"VENV={VENV}", f"DIST={dist}", "-o", str(stamp))
    assert done.returncode == 0, done.stdout + done.stderr
    expected = set()
    for pyproject in (REPO / "pyproject.toml", REPO / "packaging" / "client" / "pyproject.toml"):
        name, version = _name_and_version(pyproject)
        expected |= {f"{name}-{version}-py3-none-any.whl", f"{name}-{version}.tar.gz"}
    assert {p.name for p in dist.iterdir()} == expected

    (client_wheel,) = dist.glob("ftd_daemon_client-*.whl")
    fresh = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(fresh)], check=True, timeout=60)
    python = fresh / "bin" / "python"
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-index",
            str(client_wheel),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert install.returncode == 0, install.stderr
    probe = (
        "import importlib.util, ftd.client, ftd.supervisor\n"
        "from ftd.client import Client\n"
        "print(ftd.client.__file__)\n"
        "print(importlib.util.find_spec('ftd.coordinator'))\n"
    )
    ran = subprocess.run(
        [str(python), "-I", "-c", probe],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    where, coordinator = ran.stdout.splitlines()
    assert Path(where).is_relative_to(fresh), where  # the installed copy, not the checkout's
    assert coordinator == "None"  # the client alone: no daemon in a training image


def test_the_release_workflow_publishes_both_on_a_tag_with_trusted_publishing() -> None:
    """.github/workflows/release.yml (never run here): a tag builds with ``make dist`` and publishes
    dist/ (both projects) through PyPI's trusted publishing, with no stored token."""
    import yaml  # type: ignore[import-untyped]

    path = REPO / ".github" / "workflows" / "release.yml"
    flow = yaml.safe_load(path.read_text())
    assert flow[True] == {"push": {"tags": ["v*"]}}  # YAML 1.1 reads the key `on` as True
    build, publish = flow["jobs"]["build"], flow["jobs"]["publish"]
    runs = [step.get("run", "") for step in build["steps"]]
    assert "make dist" in runs
    assert publish["needs"] == "build" and publish["permissions"] == {"id-token": "write"}
    (upload,) = [s for s in publish["steps"] if s.get("uses", "").startswith("pypa/gh-action-pypi-publish@")]
    assert upload["with"] == {"packages-dir": "dist/"}
    assert "secrets." not in path.read_text()  # trusted publishing: no password, no API token
