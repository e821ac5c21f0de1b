// ftd dashboard: polls the coordinator's JSON API every 2 s and renders plain tables.
// No framework, no build step, no external resources: everything is served by the coordinator.
"use strict";

const REFRESH_MS = 2000;

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function pill(text, cls) {
  const td = el("td");
  td.appendChild(el("span", text, "pill " + (cls || text)));
  return td;
}

function time(ts) {
  if (!ts) return "";
  return new Date(ts * 1000).toLocaleTimeString([], { hour12: false });
}

function fill(id, rows, columns, empty) {
  const body = document.querySelector("#" + id + " tbody");
  const fresh = document.createElement("tbody");
  if (rows.length === 0) {
    const tr = el("tr");
    const td = el("td", empty, "muted");
    td.colSpan = columns;
    tr.appendChild(td);
    fresh.appendChild(tr);
  }
  for (const cells of rows) {
    const tr = el("tr");
    for (const cell of cells) tr.appendChild(cell instanceof Node ? cell : el("td", cell));
    fresh.appendChild(tr);
  }
  body.replaceWith(fresh);
}

async function getJSON(path) {
  const response = await fetch(path, { cache: "no-store" });
  if (!response.ok) throw new Error(path + ": HTTP " + response.status);
  return response.json();
}

// Who leads, from GET /v1/ha (served by the leader, a standby and a single coordinator alike):
// the header badge's text and class, and on a standby the banner. Pure, so node can test it.
function haView(ha) {
  if (!ha || !ha.role) return { badge: null, cls: "", banner: null, standby: false, leader: null };
  if (ha.role === "single") {
    const badge = "single coordinator (" + (ha.ledger || "sqlite") + " ledger, no standby)";
    return { badge, cls: "info", banner: null, standby: false, leader: null };
  }
  const epoch = ha.leader_epoch;
  const age = typeof ha.lease_age_s === "number" ? ` · lease renewed ${ha.lease_age_s.toFixed(1)} s ago` : "";
  if (ha.role === "leader") {
    const badge = `leader: ${ha.identity} (this replica) · epoch ${epoch}${age}`;
    return { badge, cls: "ok", banner: null, standby: false, leader: ha.identity };
  }
  const leader = ha.leader || null;
  let banner = leader
    ? `read-only standby — leader is ${leader} (epoch ${epoch})`
    : "read-only standby — no coordinator holds the lease: nothing acts until one takes it";
  if (ha.database_ok === false) banner += " · the database is unreachable from this replica";
  const badge = `standby: ${ha.identity} · leader: ${leader || "none"} · epoch ${epoch}${age}`;
  return { badge, cls: "warning", banner, standby: true, leader };
}

// What a standby shows where the leader's memory is needed (nodes, jobs, the goodput report).
function servedByLeader(view) {
  return "served by the leader" + (view.leader ? " (" + view.leader + ")" : "") + ": open its dashboard";
}

let lastView = haView(null);

function showHa(view) {
  const badge = document.getElementById("ha");
  badge.hidden = view.badge === null;
  badge.textContent = view.badge || "";
  badge.className = "pill " + view.cls;
  const banner = document.getElementById("banner");
  banner.hidden = view.banner === null;
  banner.textContent = view.banner || "";
}

async function refresh() {
  const health = document.getElementById("health");
  try {
    const [ha, h, actions, events] = await Promise.all([
      getJSON("/v1/ha").catch(() => null), getJSON("/healthz"),
      getJSON("/v1/actions?limit=20"), getJSON("/v1/events?limit=30"),
    ]);
    const view = haView(ha);
    const roleChanged = view.standby !== lastView.standby;
    lastView = view;
    showHa(view);
    if (view.standby) {
      health.textContent = "standby · v" + h.version;
      health.className = "pill warning";
      document.getElementById("node-summary").textContent = "";
      fill("nodes", [], 5, servedByLeader(view));
      fill("jobs", [], 4, servedByLeader(view));
    } else {
      const [nodes, jobs] = await Promise.all([getJSON("/v1/nodes"), getJSON("/v1/jobs")]);
      health.textContent = (h.bus_connected ? "bus connected" : "bus DISCONNECTED") + " · v" + h.version;
      health.className = "pill " + (h.bus_connected ? "ok" : "bad");
      const online = nodes.filter((n) => n.online).length;
      const drained = nodes.filter((n) => n.drained).length;
      document.getElementById("node-summary").textContent =
        `${nodes.length} known · ${online} online · ${drained} drained`;
      fill("nodes", nodes.map((n) => [
        n.name,
        pill(n.online ? "online" : "offline"),
        n.drained ? pill("drained") : el("td", "no"),
        n.drain_reason,
        n.jobs.join(", "),
      ]), 5, "no nodes have reported yet");
      fill("jobs", jobs.map((j) => [
        j.id, j.nodes.join(", "), j.ranks.length, j.last_step === null ? "" : j.last_step,
      ]), 4, "no jobs registered");
    }
    fill("actions", actions.map((a) => [
      time(a.created), a.kind, a.target, pill(a.state), a.rule, a.reason,
    ]), 6, "no actions yet");
    fill("events", events.map((e) => {
      const data = el("td", JSON.stringify(e.data), "data");
      return [time(e.ts), e.node, e.kind, pill(e.severity), data];
    }), 5, "no events yet");
    document.getElementById("updated").textContent = "updated " + time(Date.now() / 1000);
    if (roleChanged) refreshGoodput(); // this replica took over or stepped down
  } catch (err) {
    health.textContent = "API unreachable: " + err.message;
    health.className = "pill bad";
  }
}

// The last `ftd sim goodput --config` run (GET /v1/sim/goodput; 404 until one is saved).
async function refreshGoodput() {
  const summary = document.getElementById("goodput-summary");
  let report;
  if (lastView.standby) {
    summary.textContent = "";
    fill("goodput", [], 6, servedByLeader(lastView));
    return;
  }
  try {
    report = await getJSON("/v1/sim/goodput");
  } catch (err) {
    summary.textContent = "";
    fill("goodput", [], 6, "no run saved: ftd sim goodput --config <this coordinator's config>");
    return;
  }
  const p = report.params || {};
  summary.textContent = `last simulation: ${report.mix ? report.mix.title : ""} · ` +
    `${p.job_gpus} GPUs · checkpoint every ${p.checkpoint_interval_s} s · ${report.config || ""}`;
  fill("goodput", Object.entries(report.policies || {}).map(([name, r]) => [
    name,
    (100 * r.ettr).toFixed(2) + " %",
    Math.round(Object.values(r.lost_gpu_hours).reduce((a, b) => a + b, 0)).toLocaleString(),
    r.interruptions.toFixed(1),
    r.nodes_drained.toFixed(1),
    (r.mttr_s / 60).toFixed(1) + " min",
  ]), 6, "the run has no policies");
}

if (typeof module !== "undefined" && module.exports) {
  module.exports = { haView, servedByLeader }; // loaded by node (the unit tests), not a browser
} else {
  refresh().then(refreshGoodput);
  setInterval(refresh, REFRESH_MS);
  setInterval(refreshGoodput, 30 * REFRESH_MS);
}
