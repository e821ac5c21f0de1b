"""Run the atheris harness for a bounded number of inputs per target (a smoke fuzz in every test
run; run ``tests/fuzz/fuzz_inputs.py`` directly for long campaigns)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HARNESS = Path(__file__).with_name("fuzz_inputs.py")
REPO = HARNESS.parents[2]

pytestmark = [pytest.mark.property]


@pytest.mark.parametrize("target", ["kmsg", "bus", "culprit"])
def test_fuzz_target_survives(target: str, tmp_path: Path) -> None:
    pytest.importorskip("atheris", reason="atheris is a dev dependency (pip install 'ftd-daemon[dev]')")
    extra = []
    if target == "kmsg":  # real kernel-log tokens and lines to start from (copied: libFuzzer adds to it)
        corpus = tmp_path / "corpus"
        corpus.mkdir()
        for seed in HARNESS.with_name("corpus_kmsg").iterdir():
            (corpus / seed.name).write_bytes(seed.read_bytes())
        extra = [f"-dict={HARNESS.with_name('kmsg.dict')}", str(corpus)]
    proc = subprocess.run(
        [
            sys.executable,
            str(HARNESS),
            target,
            "-atheris_runs=30000",
            "-max_len=2048",
            "-seed=1",
            f"-artifact_prefix={tmp_path}/",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
    )
    output = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, output
    assert "Done 30000 in" in output, output  # it really ran, and ran to the end
    assert not list(tmp_path.glob("crash-*")), output
