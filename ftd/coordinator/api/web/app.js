// ftd dashboard, problems first: polls the coordinator's JSON API every 2 s and renders plain tables.
// No framework, no build step, no external resources: everything is served by the coordinator.
// The server filters, sorts and pages the nodes (/v1/nodes?problems=1&sort=severity&limit=...) and
// counts them (/v1/summary), so 10,000 nodes cost the page a few dozen rows and a few counts.
"use strict";

const REFRESH_MS = 2000;
const PAGE = 100; // problem rows per page
const TOKEN_KEY = "ftd.api.token"; // sessionStorage: gone when the tab closes
const BY_KEY = "ftd.approver"; // sessionStorage: the name recorded with this tab's approvals
// Each action kind's phases come from the coordinator (GET /v1/action-phases: its executors' own
// definition, plugins' included), read once and kept; the page holds no copy of its own.
let actionPhasesByKind = null;
const FLYING = ["pending", "running", "awaiting_approval"];

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

// A moment with its date (local time) and how long ago: "2026-12-04 16:02:11 (3 h 5 min ago)".
// ``now`` in seconds. Pure, so node can test it.
function dateTime(ts, now) {
  if (!ts) return "";
  const d = new Date(ts * 1000);
  const two = (n) => String(n).padStart(2, "0");
  const day = `${d.getFullYear()}-${two(d.getMonth() + 1)}-${two(d.getDate())}`;
  const clock = `${two(d.getHours())}:${two(d.getMinutes())}:${two(d.getSeconds())}`;
  const age = Math.max(0, Math.round(now - ts));
  let ago;
  if (age < 60) ago = `${age} s`;
  else if (age < 3600) ago = `${Math.floor(age / 60)} min`;
  else if (age < 86400) ago = `${Math.floor(age / 3600)} h ${Math.floor((age % 3600) / 60)} min`;
  else ago = `${Math.floor(age / 86400)} d ${Math.floor((age % 86400) / 3600)} h`;
  return `${day} ${clock} (${ago} ago)`;
}

// An event's data as a line an operator reads: "code 79 · pci 0000:3b:00.0 · message …", nested
// values compact, empty ones left out, cut at ``max`` characters. Pure, so node can test it.
function eventText(data, max = 400) {
  if (data === null || data === undefined) return "";
  if (typeof data !== "object") return String(data).slice(0, max);
  const parts = [];
  for (const [key, value] of Object.entries(data)) {
    if (value === null || value === undefined || value === "" || (Array.isArray(value) && value.length === 0)) continue;
    let text;
    if (typeof value === "object") {
      text = Array.isArray(value) && value.every((v) => typeof v !== "object")
        ? value.join(", ")
        : Object.entries(value).map(([k, v]) => k + "=" + (typeof v === "object" ? JSON.stringify(v) : v)).join(", ");
    } else text = String(value);
    parts.push(key.replace(/_/g, " ") + " " + text);
  }
  const line = parts.join(" · ");
  return line.length > max ? line.slice(0, max - 1) + "…" : line;
}

// The jobs panel folds the jobs that train (as healthy nodes are folded): every other state, one
// this page does not know included, is a problem and listed. Pure, so node can test it.
function foldJobs(jobs) {
  const problems = jobs.filter((j) => j.state !== "training");
  return { problems, training: jobs.length - problems.length };
}
const JOB_CLASSES = ["saving", "restarting", "pending-after-requeue", "awaiting-approval", "training"];

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

function token() {
  try { return sessionStorage.getItem(TOKEN_KEY) || ""; } catch (err) { return ""; }
}

async function getJSON(path) {
  const response = await fetch(path, { cache: "no-store" });
  if (!response.ok) throw new Error(path + ": HTTP " + response.status);
  return response.json();
}

// GET that also returns a header (X-Total-Count of /v1/nodes).
async function getPage(path) {
  const response = await fetch(path, { cache: "no-store" });
  if (!response.ok) throw new Error(path + ": HTTP " + response.status);
  return { rows: await response.json(), total: Number(response.headers.get("X-Total-Count") || 0) };
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

// Where an action stands, for the action view: ``phases`` are its kind's phases as the API serves
// them (none for a one-step kind, or when they could not be read). Pure, so node can test it.
function actionPhase(action, phases) {
  const done = (action.detail && action.detail.phases_done) || [];
  if (!FLYING.includes(action.state)) return "finished (" + action.state + ")";
  if (action.state === "awaiting_approval") return "awaiting approval";
  const waiting = action.detail && action.detail.waiting ? " · " + action.detail.waiting : "";
  if (!Array.isArray(phases) || phases.length === 0) return action.state + waiting;
  const next = phases.find((p) => !done.includes(p));
  const where = next ? next + " (" + (phases.indexOf(next) + 1) + " of " + phases.length + ")" : "last phase";
  return action.state + ": " + where + waiting;
}

// GET /v1/action-phases once (again after a failure): kind -> its phases.
async function actionPhases() {
  if (actionPhasesByKind === null) actionPhasesByKind = await getJSON("/v1/action-phases").catch(() => null);
  return actionPhasesByKind || {};
}

// "2 of 4" ranks acked the save, or "" when the action saves nothing.
// The checkpoint a restart resumes from (issue #34): the coordinator's verified choice, or the acks' step.
function resumedFrom(detail) {
  if (!detail) return "";
  const chosen = detail.resume;
  if (chosen && chosen.step !== null && chosen.step !== undefined) {
    return "step " + chosen.step + " (" + (chosen.level || "?") + ")" + (chosen.why ? ": " + chosen.why : "");
  }
  if (chosen) return "no verified checkpoint" + (chosen.why ? ": " + chosen.why : "");
  return detail.resume_step !== null && detail.resume_step !== undefined ? "step " + detail.resume_step + " (the save's acknowledgements)" : "";
}

function ranksAcked(detail) {
  if (!detail || !Array.isArray(detail.ranks) || detail.ranks.length === 0) return "";
  const acked = detail.saved ? Object.keys(detail.saved).length : 0;
  const missing = detail.save_missing && detail.save_missing.length ? " · missing " + detail.save_missing.join(", ") : "";
  return acked + " of " + detail.ranks.length + missing;
}

// Why an action is where it is: the gate's verdict, an error, an escalation. Pure.
function actionWhy(action) {
  const d = action.detail || {};
  for (const key of ["policy", "error", "not_resumed", "waiting"]) if (typeof d[key] === "string" && d[key]) return d[key];
  if (d.exclude_refused && d.exclude_refused.why) return d.exclude_refused.why;
  if (d.escalation) return "escalated: " + d.escalation;
  return "";
}

let lastView = haView(null);
let lastSummary = null;
let offset = 0;
let openAction = null;

function showHa(view) {
  const badge = document.getElementById("ha");
  badge.hidden = view.badge === null;
  badge.textContent = view.badge || "";
  badge.className = "pill " + view.cls;
  const banner = document.getElementById("banner");
  banner.hidden = view.banner === null;
  banner.textContent = view.banner || "";
}

function say(text, bad) {
  const box = document.getElementById("message");
  box.hidden = !text;
  box.textContent = text || "";
  box.className = "message" + (bad ? " bad" : "");
}

function nodesQuery() {
  const filter = document.getElementById("state-filter").value;
  const q = document.getElementById("search").value.trim();
  const sort = document.getElementById("sort").value || "severity";
  const params = new URLSearchParams({ sort, limit: String(PAGE), offset: String(offset) });
  if (filter === "") params.set("problems", "1");
  else if (filter !== "all") params.set("state", filter);
  if (q) params.set("q", q.slice(0, 128));
  return "/v1/nodes?" + params.toString();
}

function actionCell(action) {
  const td = el("td");
  if (!action) return td;
  const link = el("a", action.kind + " ", "action-link");
  link.href = "#action=" + encodeURIComponent(action.id);
  td.appendChild(link);
  td.appendChild(el("span", action.state, "pill " + action.state));
  return td;
}

function renderProblems(page) {
  fill("problems", page.rows.map((n) => [
    pill(n.severity, "sev-" + n.severity),
    el("td", n.name, "node"),
    pill(n.state, "state-" + n.state),
    el("td", (n.conditions || []).join("; "), n.conditions && n.conditions.length ? "cond" : ""),
    actionCell(n.action),
    [n.action && n.action.why, n.action && n.action.reason, n.drain_reason, n.unavailable].filter(Boolean).join(" · "),
    n.jobs.join(", "),
    sinceCell(n),
  ]), 8, "no node needs a look");
  const last = Math.min(offset + page.rows.length, page.total);
  document.getElementById("page").textContent = page.total ? `${offset + 1}–${last} of ${page.total}` : "0 of 0";
  document.getElementById("prev").disabled = offset === 0;
  document.getElementById("next").disabled = last >= page.total;
}

// When the node's problem began, with its date; "unknown" (never a blank) for a problem the API gave
// no start for; nothing for a healthy node.
function sinceCell(n) {
  if (n.since) return el("td", dateTime(n.since, Date.now() / 1000), "when");
  return el("td", n.severity === "ok" ? "" : "unknown (the coordinator did not say)", "muted");
}

function renderSummary(s) {
  const st = s.by_state;
  const parts = ["offline", "drained", "unavailable", "condition", "acting"].filter((k) => st[k]).map((k) => `${st[k]} ${k}`);
  document.getElementById("summary").textContent =
    `${s.nodes} nodes · ${s.problems} need a look · ${st.healthy} healthy` + (parts.length ? " · " + parts.join(" · ") : "");
  document.getElementById("healthy").textContent = `${st.healthy} healthy nodes are counted here, not listed`;
  const rows = [];
  for (const [label, values] of Object.entries(s.by_label || {})) {
    let quiet = 0, quietNodes = 0; // values whose every node is healthy: one row for all of them
    for (const [value, counts] of Object.entries(values)) {
      const total = Object.values(counts).reduce((a, b) => a + b, 0);
      const healthy = counts.healthy || 0;
      if (healthy === total) { quiet += 1; quietNodes += total; continue; }
      rows.push([label, value, healthy, total - healthy, total]);
    }
    rows.sort((a, b) => b[3] - a[3] || String(a[1]).localeCompare(String(b[1])));
    if (quiet) rows.push([label, `${quiet} ${label} values, every node healthy`, quietNodes, 0, quietNodes]);
  }
  if (rows.length === 0) rows.push(["all nodes", "(no node labels)", st.healthy, s.nodes - st.healthy, s.nodes]);
  const shown = rows.slice(0, 60);
  if (rows.length > shown.length) shown.push(["…", `${rows.length - shown.length} more`, "", "", ""]);
  fill("folded", shown, 5, "no nodes have reported yet");
  const waiting = s.in_flight.filter((a) => a.state === "awaiting_approval").length;
  document.getElementById("inflight-summary").textContent =
    `${s.in_flight.length} in flight` + (waiting ? ` · ${waiting} awaiting approval` : "");
  fill("inflight", s.in_flight.map((a) => [
    time(a.created), actionCell(a), a.target, pill(a.state), actionWhy(a) || a.reason, decideCell(a),
  ]), 6, "nothing in flight");
}

function decideCell(action) {
  const td = el("td", undefined, "buttons");
  if (action.state !== "awaiting_approval") return td;
  const approve = el("button", "approve", "approve");
  approve.onclick = () => decide(action.id, "approve");
  const reject = el("button", "reject", "reject");
  reject.onclick = () => decide(action.id, "reject");
  td.append(approve, " ", reject);
  return td;
}

// Who approves: the API token is one shared secret naming nobody, so the dashboard asks once per
// tab and sends it as "by" (recorded in the action's history as "NAME@dashboard").
function approver() {
  let name = "";
  try { name = sessionStorage.getItem(BY_KEY) || ""; } catch (err) { /* no storage: ask every time */ }
  if (!name) {
    const typed = window.prompt("Your name, recorded with the approval:", "");
    if (typed === null) return "";
    name = typed.replace(/[^A-Za-z0-9._-]/g, "").replace(/^[^A-Za-z0-9]+/, "").slice(0, 50);
    if (!name) { say("an approval needs a name to record", true); return ""; }
    try { sessionStorage.setItem(BY_KEY, name); } catch (err) { /* asked again next time */ }
  }
  return name + "@dashboard";
}

async function decide(id, verb) {
  const secret = token();
  if (!secret) { say("approving needs the API token: type it in the header (kept for this tab only)", true); return; }
  const body = { by: approver() };
  if (!body.by) return;
  if (verb === "reject") {
    const reason = window.prompt("Why reject " + id + "?", "rejected by operator");
    if (reason === null) return;
    body.reason = reason.replace(/[\x00-\x1f\x7f]/g, " ").slice(0, 200) || "rejected by operator";
  }
  const response = await fetch("/v1/actions/" + encodeURIComponent(id) + "/" + verb, {
    method: "POST",
    headers: { "Authorization": "Bearer " + secret, "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  let answer = {};
  try { answer = await response.json(); } catch (err) { /* not JSON */ }
  if (response.ok) say(`${verb}d ${id}: now ${answer.state}`, false);
  else say(`${verb} ${id}: HTTP ${response.status}: ${answer.error || ""}`, true);
  refresh();
  if (openAction === id) showAction(id);
}

const JOB_ROWS = 50; // jobs with a problem listed; the rest counted

function renderJobs(jobs) {
  const { problems, training } = foldJobs(jobs);
  const rows = problems.slice(0, JOB_ROWS);
  const counts = {};
  for (const j of jobs) counts[j.state] = (counts[j.state] || 0) + 1;
  document.getElementById("jobs-summary").textContent = Object.entries(counts).map(([k, v]) => `${v} ${k}`).join(" · ");
  const cells = rows.map((j) => {
    const slug = String(j.state).replace(/[ _]/g, "-");
    return [j.id, pill(j.state, JOB_CLASSES.includes(slug) ? "job-" + slug : "sev-warning"),
      j.moved ? j.moved.why : j.nodes.join(", "), j.ranks.length, j.last_step === null ? "" : j.last_step];
  });
  if (problems.length > rows.length) cells.push(["…", `${problems.length - rows.length} more`, "", "", ""]);
  fill("jobs", cells, 5, jobs.length ? "no job needs a look" : "no jobs registered");
  document.getElementById("jobs-folded").textContent =
    training ? `${training} training jobs are counted here, not listed` : "";
}

// Version drift (issue #36): the drifted nodes, and a line saying what drift does here and how many
// nodes could not be judged (never shown as "no drift").
function driftView(d) {
  const rows = (d.nodes || []).map((n) => [n.node, (n.fields || []).join(", "), (n.reasons || []).join("; "),
    n.since ? time(n.since) : "unknown"]);
  const parts = [`${(d.nodes || []).length} of ${d.reported || 0} reporting nodes drift`, `action: ${d.action}`];
  if (d.unchecked) parts.push(`${d.unchecked} not checked (no hardware profile)`);
  return { rows, summary: parts.join(" · ") };
}

function renderDrift(d) {
  const view = driftView(d);
  document.getElementById("drift-summary").textContent = view.summary;
  fill("drift", view.rows, 4, d.reported ? "no node drifts from its peers" : "no node has reported an inventory");
}

async function refreshProblems() {
  renderProblems(await getPage(nodesQuery()));
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
      document.getElementById("summary").textContent = "";
      fill("problems", [], 8, servedByLeader(view));
      fill("folded", [], 5, servedByLeader(view));
      fill("inflight", [], 6, servedByLeader(view));
      fill("jobs", [], 5, servedByLeader(view));
      fill("drift", [], 4, servedByLeader(view));
    } else {
      const [summary, page, jobs] = await Promise.all([getJSON("/v1/summary"), getPage(nodesQuery()), getJSON("/v1/jobs")]);
      lastSummary = summary;
      health.textContent = (h.bus_connected ? "bus connected" : "bus DISCONNECTED") + " · v" + h.version;
      health.className = "pill " + (h.bus_connected ? "ok" : "bad");
      renderSummary(summary);
      renderProblems(page);
      renderJobs(jobs);
      getJSON("/v1/drift").then(renderDrift, () => fill("drift", [], 4, "drift: not served by this coordinator"));
      if (!document.body.dataset.rendered) {
        // the first screen is filled: when, in ms since navigation started (the browser test reads it)
        document.body.dataset.rendered = "yes";
        document.body.dataset.renderedMs = String(Math.round(performance.now()));
      }
      if (openAction) showAction(openAction); // the open action view follows the action live
    }
    fill("actions", actions.map((a) => [
      time(a.created), actionCell(a), a.target, pill(a.state), a.rule, a.reason,
    ]), 6, "no actions yet");
    fill("events", events.map((e) => {
      const data = el("td", eventText(e.data), "data");
      data.title = JSON.stringify(e.data); // the raw data, on hover
      return [time(e.ts), e.node, e.kind, pill(e.severity), data];
    }), 5, "no events yet");
    document.getElementById("updated").textContent = "updated " + time(Date.now() / 1000);
    if (roleChanged && location.hash === "#goodput") refreshGoodput(); // this replica took over or stepped down
  } catch (err) {
    health.textContent = "API unreachable: " + err.message;
    health.className = "pill bad";
  }
}

// The action view: phase, ranks acked, deadline, why, the plan's steps, approve/reject.
async function showAction(id) {
  const opening = openAction !== id;
  openAction = id;
  const box = document.getElementById("action-view");
  box.hidden = false;
  if (opening) box.scrollIntoView({ block: "start" });
  document.getElementById("action-id").textContent = id;
  let action;
  try {
    action = await getJSON("/v1/actions/" + encodeURIComponent(id));
  } catch (err) {
    document.getElementById("action-facts").replaceChildren(el("dd", err.message));
    return;
  }
  if (!lastSummary && !lastView.standby) lastSummary = await getJSON("/v1/summary").catch(() => null);
  const phases = (await actionPhases())[action.kind];
  const deadline = lastSummary && lastSummary.deadlines ? lastSummary.deadlines[id] : undefined;
  const facts = [
    ["action", action.kind + " on " + action.target],
    ["state", action.state],
    ["phase", actionPhase(action, phases)],
    ["ranks acked", ranksAcked(action.detail) || "—"],
    ["deadline", deadline && FLYING.includes(action.state) ? time(deadline) + (deadline * 1000 < Date.now() ? " (passed: stuck)" : "") : "—"],
    ["why", actionWhy(action) || "—"],
    ["resumes from", resumedFrom(action.detail) || "—"],
    ["reason", action.reason],
    ["rule", action.rule],
    ["created", time(action.created) + " · updated " + time(action.updated)],
  ];
  const verdict = action.detail && action.detail.verdict;
  if (verdict && typeof verdict === "object") {  // diagnose_hang (issue #33): the verdict and its evidence
    facts.push(["verdict", verdict.kind + (verdict.confident ? " (confident)" : " (not confident)") + ": " + verdict.why]);
    if ((verdict.culprit_nodes || []).length) facts.push(["culprit", verdict.culprit_nodes.join(", ")]);
    for (const item of verdict.evidence || []) {
      facts.push(["evidence: " + item.source, (item.node ? item.node + (item.rank != null ? " rank " + item.rank : "") + ": " : "") + item.says]);
    }
    if ((verdict.unanswered || []).length) facts.push(["did not answer", verdict.unanswered.join(", ")]);
    if (action.detail.tree) facts.push(["merged stacks", action.detail.tree]);
  }
  const dl = document.getElementById("action-facts");
  dl.replaceChildren(...facts.flatMap(([k, v]) => [el("dt", k), el("dd", v)]));
  if (action.state === "awaiting_approval") {
    const dd = el("dd");
    dd.appendChild(decideCell(action));
    dl.append(el("dt", "decide"), dd);
  }
  document.getElementById("action-detail").textContent = JSON.stringify(action.detail, null, 2);
  const planId = action.detail && action.detail.plan;
  document.getElementById("plan-id").textContent = planId || "";
  if (!planId) { fill("plan", [], 4, "not part of a plan"); return; }
  try {
    const plan = await getJSON("/v1/plans/" + encodeURIComponent(planId));
    fill("plan", plan.steps.map((s, i) => [i + 1, s.kind, s.target, pill(s.state || "missing")]), 4, "no steps");
  } catch (err) {
    fill("plan", [], 4, err.message);
  }
}

// The last `ftd sim goodput --config` run (GET /v1/sim/goodput; 404 until one is saved): its own tab.
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

// The pair-test matrix (issue #35; GET /v1/fabric/pairs): a row per sending node, a column per
// receiving node, each cell that direction's newest Gbit/s and its verdict (the reasons on hover).
// The nodes with a slow or failed direction come first; at most MATRIX_MAX are drawn.
const MATRIX_MAX = 48;

function pairGrid(matrix, max = MATRIX_MAX) {
  const cells = new Map();
  const trouble = new Set();
  for (const c of matrix.cells || []) {
    cells.set(c.from + "\u0000" + c.to, c);
    if (c.status !== "pass") { trouble.add(c.from); trouble.add(c.to); }
  }
  const byName = (a, b) => (a < b ? -1 : a > b ? 1 : 0);
  const nodes = [...(matrix.nodes || [])].sort((a, b) => (trouble.has(b) - trouble.has(a)) || byName(a, b));
  const shown = nodes.slice(0, max);
  const rows = shown.map((from) => [from, ...shown.map((to) => {
    const c = cells.get(from + "\u0000" + to);
    if (!c) return { text: from === to ? "" : "·", status: "none", title: "not tested" };
    const text = c.error ? "failed" : c.gbps == null ? "?" : c.gbps.toPrecision(3);
    return { text, status: c.status, title: (c.reasons || []).join("; ") };
  })]);
  return { nodes: shown, rows, hidden: nodes.length - shown.length };
}

// The round-trip matrix: per pair direction the newest RTT of a pair test or a pingmesh probe
// (whichever is younger), a probe coloured by its own verdict, a test's RTT against the limit the
// API serves (rtt_limit_ms: the lower of the profile's max_rtt_ms and 10 x the fleet's RTT baseline;
// neither yet: shown, not judged).
function rttGrid(matrix, max = MATRIX_MAX) {
  const newest = new Map();
  const keep = (key, cell) => {
    const had = newest.get(key);
    if (cell.rtt_ms != null && (!had || cell.age_s < had.age_s)) newest.set(key, cell);
  };
  const limit = matrix.rtt_limit_ms ?? matrix.max_rtt_ms;
  for (const c of matrix.cells || []) {
    const status = c.error ? "failed" : limit == null ? "pass" : c.rtt_ms > limit ? "slow" : "pass";
    keep(c.from + "\u0000" + c.to, { rtt_ms: c.rtt_ms, age_s: c.age_s, status, what: "pair test" });
  }
  for (const p of matrix.probes || []) {
    keep(p.from + "\u0000" + p.to, { rtt_ms: p.rtt_ms, age_s: p.age_s, status: p.status, what: "probe" });
  }
  const trouble = new Set();
  const nodes = new Set(matrix.nodes || []);
  for (const [key, c] of newest) {
    const [from, to] = key.split("\u0000");
    nodes.add(from); nodes.add(to);
    if (c.status !== "pass") { trouble.add(from); trouble.add(to); }
  }
  const byName = (a, b) => (a < b ? -1 : a > b ? 1 : 0);
  const sorted = [...nodes].sort((a, b) => (trouble.has(b) - trouble.has(a)) || byName(a, b));
  const shown = sorted.slice(0, max);
  const rows = shown.map((from) => [from, ...shown.map((to) => {
    const c = newest.get(from + "\u0000" + to);
    if (!c) return { text: from === to ? "" : "·", status: "none", title: "no round trip measured" };
    const judged = limit == null && c.what === "pair test" ? " (no max_rtt_ms, no RTT baseline yet: not judged)" : "";
    return { text: c.rtt_ms.toPrecision(3), status: c.status, title: `${c.what}, ${c.age_s} s ago${judged}` };
  })]);
  return { nodes: shown, rows, hidden: sorted.length - shown.length };
}

// What the round trips are judged against, in words: the limit and where it comes from.
function rttLimitText(matrix) {
  if (matrix.rtt_limit_ms != null) {
    return `RTT limit ${Number(matrix.rtt_limit_ms.toPrecision(3))} ms (${matrix.rtt_limit})`;
  }
  if (matrix.max_rtt_ms != null) return `RTT limit ${matrix.max_rtt_ms} ms (max_rtt_ms)`;
  return "no max_rtt_ms, no RTT baseline yet: round trips not judged";
}

function drawGrid(table, grid, corner) {
  const head = el("tr");
  head.appendChild(el("th", corner));
  for (const n of grid.nodes) head.appendChild(el("th", n));
  const thead = el("thead");
  thead.appendChild(head);
  const tbody = el("tbody");
  for (const [from, ...cells] of grid.rows) {
    const tr = el("tr");
    tr.appendChild(el("th", from));
    for (const c of cells) {
      const td = el("td", c.text, "pair-" + c.status);
      td.title = c.title;
      tr.appendChild(td);
    }
    tbody.appendChild(tr);
  }
  table.replaceChildren(thead, tbody);
}

async function refreshFabric() {
  const summary = document.getElementById("fabric-summary");
  const table = document.getElementById("pairs");
  let matrix;
  try {
    matrix = await getJSON("/v1/fabric/pairs");
  } catch (err) {
    summary.textContent = "the pair matrix could not be read: " + err;
    return;
  }
  const grid = pairGrid(matrix);
  drawGrid(table, grid, "from \\ to (Gbit/s)");
  const rtt = rttGrid(matrix);
  drawGrid(document.getElementById("pair-rtt"), rtt, "from \\ to (ms)");
  const limit = rttLimitText(matrix);
  document.getElementById("rtt-summary").textContent = `${rtt.nodes.length} node(s)` +
    (rtt.hidden ? ` (${rtt.hidden} more, all passing)` : "") + ` · ${limit} · newest of a test or a probe`;
  const expected = matrix.expected_gbps == null ? "no spec" : `spec ${matrix.expected_gbps} Gbit/s`;
  const baseline = matrix.baseline_gbps == null ? "no baseline yet" : `baseline ${matrix.baseline_gbps.toPrecision(3)} Gbit/s`;
  summary.textContent = `${grid.nodes.length} node(s)` + (grid.hidden ? ` (${grid.hidden} more, all passing)` : "") +
    ` · profile ${matrix.profile || "none"} · ${expected} · ${baseline}` + (matrix.note ? ` · ${matrix.note}` : "");
}

function route() {
  const goodput = location.hash === "#goodput";
  const fabric = location.hash === "#fabric";
  document.getElementById("oncall").hidden = goodput || fabric;
  document.getElementById("goodput-view").hidden = !goodput;
  document.getElementById("fabric-view").hidden = !fabric;
  document.getElementById("tab-oncall").classList.toggle("current", !goodput && !fabric);
  document.getElementById("tab-goodput").classList.toggle("current", goodput);
  document.getElementById("tab-fabric").classList.toggle("current", fabric);
  if (goodput) refreshGoodput();
  if (fabric) refreshFabric();
  if (location.hash.startsWith("#action=")) showAction(decodeURIComponent(location.hash.slice(8)));
}

function showToken() {
  const has = token() !== "";
  document.getElementById("token").hidden = has;
  document.getElementById("token-save").hidden = has;
  document.getElementById("token-forget").hidden = !has;
}

function wire() {
  let timer = null;
  document.getElementById("search").addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(() => { offset = 0; refreshProblems(); }, 250);
  });
  for (const id of ["state-filter", "sort"]) {
    document.getElementById(id).addEventListener("change", () => { offset = 0; refreshProblems(); });
  }
  document.getElementById("prev").onclick = () => { offset = Math.max(0, offset - PAGE); refreshProblems(); };
  document.getElementById("next").onclick = () => { offset += PAGE; refreshProblems(); };
  document.getElementById("action-close").onclick = () => {
    openAction = null;
    document.getElementById("action-view").hidden = true;
    if (location.hash.startsWith("#action=")) history.replaceState(null, "", "#");
  };
  document.getElementById("token-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const input = document.getElementById("token");
    try { sessionStorage.setItem(TOKEN_KEY, input.value.trim()); } catch (err) { say("this browser keeps no session storage", true); }
    input.value = "";
    showToken();
  });
  document.getElementById("token-forget").onclick = () => { sessionStorage.removeItem(TOKEN_KEY); showToken(); };
  window.addEventListener("hashchange", route);
  showToken();
  route();
}

if (typeof module !== "undefined" && module.exports) {
  // loaded by node (the unit tests), not a browser
  module.exports = { haView, servedByLeader, actionPhase, ranksAcked, actionWhy, resumedFrom, dateTime, eventText, foldJobs, approver, driftView, pairGrid, rttGrid, rttLimitText };
} else {
  wire();
  refresh();
  setInterval(refresh, REFRESH_MS);
  setInterval(() => { if (location.hash === "#goodput") refreshGoodput(); }, 30 * REFRESH_MS);
  setInterval(() => { if (location.hash === "#fabric") refreshFabric(); }, 5 * REFRESH_MS);
}
