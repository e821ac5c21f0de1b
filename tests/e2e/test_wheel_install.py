"""The distributions as a user gets them: built like ``make dist``, installed into clean venvs.

What: builds the sdist and, from it, the wheel of ftd-daemon and of ftd-daemon-client (``python -m
build --no-isolation``, the backend from this venv: nothing is fetched); checks the wheel carries
the package data the daemons read at run time (the Xid catalog, the log patterns, the dashboard, the
simulator's data); installs it into a fresh venv without the checkout on its path and runs ``ftd
--version`` and ``ftd demo``; installs the client wheel alone into another and imports the client.

How it stays offline and quick: the venvs have no pip of their own (this venv's pip installs into
them with ``--python``, ``--no-index --no-deps``); the daemon venv finds its dependencies through a
``.pth`` line naming this venv's site-packages, appended after its own (so ``ftd`` is the wheel's:
the test checks where it was imported from). About 6 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.e2e.daemons import REPO

pytestmark = pytest.mark.slow

PY = sys.executable
#: Files the installed daemons open by path inside the package (not .py modules).
PACKAGE_DATA = {
    "ftd/catalog/xid.toml",
    "ftd/catalog/log_patterns.toml",
    "ftd/coordinator/api/web/index.html",
    "ftd/coordinator/api/web/app.js",
    "ftd/coordinator/api/web/style.css",
    "ftd/sim/data/llama3_faults.toml",
    "ftd/sim/data/opt175b.toml",
}


def run(*args: str | Path, cwd: Path, timeout: float = 120) -> str:
    done = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{args}: {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def build(source: Path, out: Path) -> tuple[Path, Path]:
    """(sdist, wheel) of the project at ``source``; the wheel built from the sdist, as pip would."""
    run(PY, "-m", "build", "--no-isolation", "--outdir", out, source, cwd=out, timeout=300)
    (sdist,), (wheel,) = sorted(out.glob("*.tar.gz")), sorted(out.glob("*.whl"))
    return sdist, wheel


def venv_with(wheel: Path, where: Path) -> Path:
    """A fresh venv at ``where`` holding ``wheel`` (no dependencies); its python."""
    run(PY, "-m", "venv", "--without-pip", where, cwd=where.parent)
    python = where / "bin" / "python"
    pip = [PY, "-m", "pip", "--python", python, "install", "--quiet", "--no-index", "--no-deps", wheel]
    run(*pip, cwd=where.parent, timeout=300)
    return python


def test_the_ftd_daemon_wheel_installs_and_runs_the_demo(tmp_path: Path) -> None:
    from ftd import __version__

    sdist, wheel = build(REPO, tmp_path)
    assert wheel.name == f"ftd_daemon-{__version__}-py3-none-any.whl" and sdist.name.startswith("ftd_daemon-")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert names >= PACKAGE_DATA, PACKAGE_DATA - names
    metadata = zipfile.ZipFile(wheel).read(f"ftd_daemon-{__version__}.dist-info/METADATA").decode()
    assert "Name: ftd-daemon\n" in metadata and "Requires-Python: >=3.11" in metadata
    assert (
        "ftd = ftd.cli:main"
        in zipfile.ZipFile(wheel).read(f"ftd_daemon-{__version__}.dist-info/entry_points.txt").decode()
    )

    python = venv_with(wheel, tmp_path / "venv")
    site = run(
        python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path
    ).strip()
    # the daemons' dependencies from this venv, after the wheel's own site-packages
    (Path(site) / "zz_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    where = run(python, "-c", "import ftd.cli; print(ftd.cli.__file__)", cwd=tmp_path).strip()
    assert where.startswith(site), where  # the wheel's ftd, not the checkout's
    ftd = tmp_path / "venv" / "bin" / "ftd"
    assert run(ftd, "--version", cwd=tmp_path).strip() == f"ftd {__version__}"
    summary = json.loads(run(ftd, "demo", "--json", cwd=tmp_path, timeout=180).splitlines()[-1])
    assert summary["ok"] is True and summary["drained"] == ["node-2"]


def test_the_client_wheel_is_the_client_alone(tmp_path: Path) -> None:
    from ftd import __version__

    _, wheel = build(REPO / "packaging" / "client", tmp_path)
    assert wheel.name == f"ftd_daemon_client-{__version__}-py3-none-any.whl"
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {n for n in names if not n.startswith("ftd_daemon_client-")}
    assert modules == {
        f"ftd/{package}/{p.name}"
        for package in ("client", "supervisor")
        for p in (REPO / "ftd" / package).glob("*.py")
    }
    metadata = zipfile.ZipFile(wheel).read(f"ftd_daemon_client-{__version__}.dist-info/METADATA").decode()
    assert "Requires-Python: >=3.9" in metadata
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert requires and all("extra ==" in line for line in requires), requires  # stdlib only
    python = venv_with(wheel, tmp_path / "venv")
    code = (
        "import ftd, ftd.client, importlib.util as u; "
        "print(ftd.client.Client.__name__, u.find_spec('ftd.agent') is None, ftd.client.__file__)"
    )
    name, no_daemons, where = run(python, "-c", code, cwd=tmp_path).split()
    assert (name, no_daemons) == ("Client", "True") and where.startswith(str(tmp_path / "venv")), where
    # The rank supervisor runs from it too (ftd run without ftd): a setup error is its clear exit 2.
    done = subprocess.run(
        [str(python), "-m", "ftd.supervisor", "--", "true"],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith("SLURM_")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stderr.strip()) == (
        2,
        "ftd run: --nodes not given and SLURM_NNODES not set: how many training nodes?",
    ), done.stderr
