"""``ftd demo --serve``: after the scenario the coordinator's API and dashboard stay up at the URL the
demo prints, ``ftd status`` reads them, and Ctrl-C (SIGINT) ends the demo cleanly with its summary,
without a traceback. With ``--nodes 10000`` (4 real agents, the other nodes seeded) the dashboard's
first screen shows the incident in a real Chromium within seconds (issue #32: the figure is printed;
the target, 10 s, is asserted loosely, since CI machines are loaded)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.e2e.daemons import REPO
from tests.e2e.test_dashboard_scale import page_value
from tests.realparts import free_port

pytestmark = pytest.mark.slow


def serve(port: int, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ftd.cli", "demo", "--json", "--serve", "--port", str(port), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )


def until_served(proc: subprocess.Popen[str], url: str) -> list[str]:
    """The demo's lines up to the one that prints the dashboard's URL."""
    assert proc.stdout is not None
    deadline = time.monotonic() + 120
    seen: list[str] = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        assert line, "".join(seen) + (proc.stderr.read() if proc.stderr else "")
        seen.append(line)
        if url in line:
            break
    assert f"dashboard and API: {url}" in seen[-1], seen
    return seen


def test_serve_keeps_the_dashboard_up_until_interrupted() -> None:
    port = free_port()
    proc = serve(port)
    try:
        url = f"http://127.0.0.1:{port}/"
        until_served(proc, url)
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
    assert "Traceback" not in err, err[-3000:]
    assert "done: as expected" in out
    assert json.loads(out.strip().splitlines()[-1])["ok"] is True


# In the page once filled: the problems panel's node rows and where each ends (page coordinates).
FIRST_SCREEN = """(() => {
  if (!document.body.dataset.rendered) return "";
  const rows = {};
  for (const td of document.querySelectorAll("#problems td.node")) {
    rows[td.textContent] = td.closest("tr").getBoundingClientRect().bottom + scrollY;
  }
  const summary = document.getElementById("summary").textContent;
  return JSON.stringify({ rows, summary, renderedMs: Number(document.body.dataset.renderedMs) });
})()"""


def test_serve_10000_nodes_shows_the_incident_on_the_first_screen() -> None:
    nodes = 10_000
    port = free_port()
    started = time.monotonic()
    proc = serve(port, "--nodes", str(nodes))
    try:
        url = f"http://127.0.0.1:{port}/"
        seen = until_served(proc, url)
        served_s = time.monotonic() - started
        page = json.loads(page_value(url, FIRST_SCREEN, timeout_s=60))
        shown_s = time.monotonic() - started
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    print(
        f"ftd demo --serve --nodes {nodes}: URL printed after {served_s:.1f} s; the page's first screen "
        f"filled {page['renderedMs']:.0f} ms after its navigation began; {shown_s:.1f} s from the "
        "command to that screen, a headless Chromium's start included"
    )
    assert any("9996 more nodes seeded online" in line for line in seen), seen
    assert f"{nodes} nodes" in page["summary"], page
    assert "node-2" in page["rows"] and page["rows"]["node-2"] <= 800, page  # drained: the incident
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1])["ok"] is True
    assert shown_s < 60  # the target is 10 s (measured and printed above); loose for a loaded CI
