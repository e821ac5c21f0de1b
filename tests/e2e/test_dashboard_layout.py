"""The on-call dashboard's layout in a real headless Chromium at 1280x800 (issue #32): the tabs hide
and show their views, every control and cell lies inside its card (nothing clipped: the approve and
reject buttons, the reason column), and with 10,000 nodes and 300 jobs every incident is on the first
screen while the training jobs are folded into a count, so the recent actions are not screens away.

The cluster is :mod:`tests.e2e.test_dashboard_scale`'s (its seed: incidents, a held drain, a job
being restarted); the page is measured where it runs, with the browser's own bounding boxes
(:func:`~tests.e2e.test_dashboard_scale.page_value` over the DevTools protocol).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.test_dashboard_scale import APPROVAL, INCIDENTS, labels, page_value, seed
from tests.unit.live_api import live_api

pytestmark = [pytest.mark.real]

WIDTH, HEIGHT = 1280, 800

# Run in the page once its first refresh filled it: what is shown, what sticks out of its card, where
# the problem rows and the sections are (page coordinates, so "first screen" is bottom <= 800).
LAYOUT = """(() => {
  if (!document.body.dataset.rendered) return "";
  const shown = (e) => e !== null && e.getClientRects().length > 0;
  const out = { width: innerWidth, height: innerHeight, outside: [], overflow: [], rows: {}, tops: {} };
  out.oncall = shown(document.getElementById("oncall"));
  out.goodput = shown(document.getElementById("goodput-view"));
  for (const c of document.querySelectorAll("header button, header input, header a")) {
    const r = c.getBoundingClientRect();
    const out_ = r.right > innerWidth + 0.5 || r.left < -0.5;
    if (shown(c) && out_) out.outside.push("header " + c.textContent);
  }
  for (const sec of document.querySelectorAll("section")) {
    if (!shown(sec)) continue;
    const title = sec.querySelector("h2").textContent.trim().slice(0, 30);
    const box = sec.getBoundingClientRect();
    out.tops[title] = box.top + scrollY;
    if (box.right > innerWidth + 0.5) out.outside.push(title + ": card ends at " + box.right);
    const wide = sec.scrollWidth > sec.clientWidth + 1;
    if (wide) out.overflow.push(title + ": " + sec.scrollWidth + " > " + sec.clientWidth);
    for (const c of sec.querySelectorAll("button, input, select, th, td")) {
      if (!shown(c)) continue;
      const r = c.getBoundingClientRect();
      if (r.left < box.left - 0.5 || r.right > box.right + 0.5) {
        out.outside.push(title + ": " + c.tagName + " " + (c.textContent || c.id).trim().slice(0, 40));
      }
    }
  }
  for (const td of document.querySelectorAll("#problems td.node")) {
    out.rows[td.textContent] = td.closest("tr").getBoundingClientRect().bottom + scrollY;
  }
  out.buttons = [...document.querySelectorAll("#inflight button")].map((b) => b.textContent);
  out.jobsFolded = (document.getElementById("jobs-folded") || {}).textContent || "";
  out.jobRows = document.querySelectorAll("#jobs tbody tr").length;
  const rows = [...document.querySelectorAll("#problems tbody tr")];
  out.since = rows.map((tr) => tr.lastElementChild.textContent);
  return JSON.stringify(out);
})()"""


def layout(url: str) -> dict[str, Any]:
    value = page_value(url, LAYOUT, timeout_s=60)
    out: dict[str, Any] = json.loads(value)
    return out


def test_layout_at_1280x800_with_10000_nodes_and_300_jobs() -> None:
    with live_api(seed, node_labels=labels()) as url:
        oncall = layout(f"{url}/")
        goodput = layout(f"{url}/#goodput")
    print(json.dumps({k: oncall[k] for k in ("tops", "overflow", "outside", "jobsFolded")}, indent=1))
    assert (oncall["width"], oncall["height"]) == (WIDTH, HEIGHT)

    # The tabs: one view at a time.
    assert oncall["oncall"] and not oncall["goodput"]
    assert goodput["goodput"] and not goodput["oncall"]

    # Nothing clipped or sticking out of its card: the approve/reject buttons, the reason column.
    assert oncall["outside"] == [] and oncall["overflow"] == []
    assert goodput["outside"] == [] and goodput["overflow"] == []
    assert oncall["buttons"] == ["approve", "reject"]

    # Every incident on the first screen, with when its problem began (a date, not only a time).
    for node in [*INCIDENTS, "node-2"]:
        assert node in oncall["rows"], node
        assert oncall["rows"][node] <= HEIGHT, (node, oncall["rows"][node])
    assert all(len(s) > 0 and s[:4].isdigit() and s[4] == "-" for s in oncall["since"]), oncall["since"]

    # The 297 training jobs are counted, not listed; the recent actions are near, not 18 screens down.
    assert "training jobs are counted here, not listed" in oncall["jobsFolded"]
    assert oncall["jobRows"] < 10
    assert oncall["tops"]["Recent actions"] < 3 * HEIGHT, oncall["tops"]
    assert APPROVAL[0] in oncall["rows"]
