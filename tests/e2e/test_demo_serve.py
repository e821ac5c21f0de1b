"""``ftd demo --serve``: after the scenario the coordinator's API and dashboard stay up at the URL the
demo prints, ``ftd status`` reads them, and Ctrl-C (SIGINT) ends the demo cleanly with its summary."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.e2e.daemons import REPO
from tests.realparts import free_port

pytestmark = pytest.mark.slow


def test_serve_keeps_the_dashboard_up_until_interrupted() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ftd.cli", "demo", "--json", "--serve", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert proc.stdout is not None
        url = f"http://127.0.0.1:{port}/"
        deadline = time.monotonic() + 120
        seen = []
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, "".join(seen) + (proc.stderr.read() if proc.stderr else "")
            seen.append(line)
            if url in line:
                break
        assert f"dashboard and API: {url}" in seen[-1], seen
        with urllib.request.urlopen(url, timeout=10) as page:
            assert page.status == 200 and "<html" in page.read().decode().lower()
        status = subprocess.run(
            [sys.executable, "-m", "ftd.cli", "status", "--url", url, "--json"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
        assert status.returncode == 0, status.stderr
        view = json.loads(status.stdout)
        assert "node-2" in json.dumps(view["nodes"]), view["nodes"]
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    assert "done: as expected" in out
    assert json.loads(out.strip().splitlines()[-1])["ok"] is True
