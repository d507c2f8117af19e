// The inferq dashboard: reads /dashboard/api/* every few seconds and renders
// tables and small SVG charts. No framework, no build step. Every value is put
// in the page as text (never as HTML), so data cannot inject markup.
"use strict";

const REFRESH_MS = 2000;
let operator = false;
let dlqCursor = null;

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const c of cells) {
    const td = document.createElement("td");
    if (c instanceof Node) td.appendChild(c); else td.textContent = c === null || c === undefined ? "-" : String(c);
    tr.appendChild(td);
  }
  return tr;
}

function fill(tableId, rows) {
  const body = document.querySelector(`#${tableId} tbody`);
  body.replaceChildren(...rows);
}

async function api(path, opts = {}) {
  const init = { credentials: "same-origin", headers: {}, ...opts };
  if (init.method && init.method !== "GET") init.headers["X-Inferq-Dashboard"] = "1";
  const resp = await fetch(path, init);
  const body = await resp.json().catch(() => ({}));
  if (!resp.ok) {
    const msg = (body.error && body.error.message) || resp.statusText;
    throw new Error(`${resp.status}: ${msg}`);
  }
  return body;
}

function showError(e) {
  const p = document.getElementById("error");
  if (e) { p.textContent = String(e.message || e); p.hidden = false; } else { p.hidden = true; }
}

const secs = (v) => (v === null || v === undefined ? "-" : `${Number(v).toFixed(1)}s`);
const when = (t) => (t ? new Date(t * 1000).toLocaleTimeString() : "-");

// -- charts -------------------------------------------------------------------
function chart(id, points, keys) {
  const svg = document.getElementById(id);
  svg.replaceChildren();
  const W = 400, H = 120, pad = 14;
  const vals = points.flatMap((p) => keys.map((k) => p[k]).filter((v) => v !== null && v !== undefined));
  const max = Math.max(1e-9, ...vals);
  const ns = "http://www.w3.org/2000/svg";
  keys.forEach((k, i) => {
    const pts = points.map((p, j) => [p[k], j]).filter(([v]) => v !== null && v !== undefined)
      .map(([v, j]) => `${pad + (j / Math.max(1, points.length - 1)) * (W - 2 * pad)},${H - pad - (v / max) * (H - 2 * pad)}`);
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", pts.join(" "));
    line.setAttribute("class", i === 0 ? "a" : "b");
    svg.appendChild(line);
  });
  const label = document.createElementNS(ns, "text");
  label.setAttribute("x", 2); label.setAttribute("y", 10);
  label.textContent = `max ${max.toPrecision(3)}`;
  svg.appendChild(label);
}

// -- views --------------------------------------------------------------------
async function loadQueues() {
  const q = await api("/dashboard/api/queues");
  fill("queue-table", q.data.map((m) => row([m.model, m.waiting, m.pending, secs(m.oldest_waiting_s), m.dlq,
    `${m.workers_alive}/${m.workers.length}`, m.lanes_total])));
  const lanes = q.data.flatMap((m) => m.lanes.map((ln) => row([m.model, ln.cls, ln.tenant || "(shared)", ln.partition,
    ln.waiting, ln.pending, secs(ln.oldest_waiting_s)])));
  fill("lane-table", lanes);
  const s = await api("/dashboard/api/series");
  // Summed over models: one line each for the whole queue.
  const byAt = new Map();
  for (const p of s.data) {
    const a = byAt.get(p.at) || { waiting: 0, pending: 0, tokens_per_s: 0, ttft_p50_s: null, ttft_p90_s: null };
    a.waiting += p.waiting; a.pending += p.pending; a.tokens_per_s += p.tokens_per_s;
    for (const k of ["ttft_p50_s", "ttft_p90_s"]) {  // the slowest model's
      if (p[k] !== null && (a[k] === null || p[k] > a[k])) a[k] = p[k];
    }
    byAt.set(p.at, a);
  }
  const pts = [...byAt.values()];
  chart("chart-backlog", pts, ["waiting", "pending"]);
  chart("chart-throughput", pts, ["tokens_per_s"]);
  chart("chart-ttft", pts, ["ttft_p50_s", "ttft_p90_s"]);
}

async function loadWorkers() {
  const w = await api("/dashboard/api/workers");
  fill("worker-table", w.data.map((x) => {
    const m = x.metrics || {};
    const state = el("span", x.alive ? `alive, ${secs(x.last_heartbeat_age_s)} ago` : `stale (${secs(x.last_heartbeat_age_s)})`,
      x.alive ? "alive" : "dead");
    const limit = m.doctor ? `${m.doctor.bottleneck}: ${m.doctor.findings[0].summary}`
      : (m.error ? `metrics unreadable: ${m.error}` : (x.metrics ? "sampling…" : "no metrics URL configured"));
    return row([x.name, x.model, state, m.running, m.in_flight,
      m.kv_cache_usage !== undefined ? `${(100 * m.kv_cache_usage).toFixed(1)}%` : "-",
      m.preemptions_kv !== undefined ? `${m.preemptions_kv} / ${m.preemptions_priority}` : "-", limit]);
  }));
}

async function loadJob(id) {
  const j = await api(`/dashboard/api/jobs/${encodeURIComponent(id)}`);
  document.getElementById("job-view").hidden = false;
  document.getElementById("job-status").textContent = j.status;
  document.getElementById("job-model").textContent = j.model;
  document.getElementById("job-attempt").textContent = j.attempt;
  const items = j.timeline.map((t) => {
    const what = {
      queued: "queued",
      started: `attempt ${t.attempt} started on ${t.worker}`,
      first_token: `attempt ${t.attempt}: first token`,
      restarted: `attempt ${t.attempt} restarted${t.reason ? ` (${t.reason})` : ""}`,
      done: `done (${t.finish_reason}, attempt ${t.attempt})`,
      error: `error ${t.code}: ${t.message}`,
    }[t.type] || t.type;
    const li = el("li", `${when(t.at)}  ${what}`);
    li.dataset.type = t.type;
    li.dataset.attempt = t.attempt;
    return li;
  });
  document.getElementById("job-timeline").replaceChildren(...items);
  fill("job-attempts", j.attempts.map((a) => row([a.attempt, a.worker, when(a.started_at), when(a.first_token_at),
    when(a.ended_at), a.outcome, a.tokens])));
  document.getElementById("job-text").textContent = j.text;
}

async function loadDlq() {
  const d = await api("/dashboard/api/dlq?limit=50" + (dlqCursor ? `&cursor=${encodeURIComponent(dlqCursor)}` : ""));
  fill("dlq-table", d.data.map((x) => {
    const actions = el("span");
    const retry = el("button", "Retry", "dlq-retry");
    retry.dataset.job = x.job_id;
    retry.onclick = () => act(`/dashboard/api/dlq/${encodeURIComponent(x.model)}/${x.partition}/${x.dlq_id}/retry`, "POST");
    const del = el("button", "Delete", "dlq-delete");
    del.dataset.job = x.job_id;
    del.onclick = () => confirm(`Delete DLQ entry ${x.dlq_id}?`) &&
      act(`/dashboard/api/dlq/${encodeURIComponent(x.model)}/${x.partition}/${x.dlq_id}`, "DELETE");
    actions.append(retry, " ", del);
    const job = el("a", x.job_id || "-");
    job.href = `#job=${x.job_id}`;
    const r = row([x.model, x.dlq_id, job, x.code, x.reason, x.attempts, when(Number(x.failed_at)), actions]);
    r.dataset.job = x.job_id;
    return r;
  }));
  const more = document.getElementById("dlq-more");
  more.hidden = !d.next_cursor;
  more.onclick = () => { dlqCursor = d.next_cursor; loadDlq().catch(showError); };
}

async function loadBatches() {
  const b = await api("/dashboard/api/batches?limit=20");
  fill("batch-table", b.data.map((x) => {
    const c = x.request_counts;
    const done = c.completed + c.failed;
    const bar = el("div", null, "bar");
    const fillEl = el("div");
    fillEl.style.width = `${c.total ? Math.round((100 * done) / c.total) : 0}%`;
    bar.appendChild(fillEl);
    let cancel = "";
    if (["validating", "in_progress"].includes(x.status)) {
      cancel = el("button", "Cancel", "batch-cancel");
      cancel.onclick = () => act(`/dashboard/api/batches/${x.id}/cancel`, "POST");
    }
    const r = row([x.id, x.status, bar, c.completed, c.failed, c.total, when(x.created_at), cancel]);
    r.dataset.batch = x.id;
    r.dataset.status = x.status;
    return r;
  }));
}

async function loadWebhooks() {
  const w = await api("/dashboard/api/webhooks?limit=50");
  document.getElementById("webhook-depth").textContent = w.enabled
    ? `${w.pending} waiting to be sent, ${w.backlog} records not yet routed, ${w.dead_total} dead letters`
    : "webhooks are turned off on this gateway";
  fill("webhook-table", w.recent.map((x) => {
    const r = row([when(x.at), x.event, x.type, x.tenant, x.url, x.outcome, x.attempts, x.error || ""]);
    r.dataset.outcome = x.outcome;
    return r;
  }));
  fill("webhook-dead-table", w.dead.map((x) => {
    const r = row([when(x.at), x.event, x.type, x.tenant, x.url, x.attempts, x.error]);
    r.dataset.event = x.event;
    return r;
  }));
}

async function act(path, method) {
  try { await api(path, { method }); showError(null); await refresh(); } catch (e) { showError(e); }
}

function jobFromHash() {
  const m = location.hash.match(/^#job=(.+)$/);
  return m ? decodeURIComponent(m[1]) : null;
}

async function refresh() {
  const tasks = [loadBatches()];
  if (operator) tasks.push(loadQueues(), loadWorkers(), loadDlq(), loadWebhooks());
  const id = jobFromHash();
  if (id) tasks.push(loadJob(id));
  const results = await Promise.allSettled(tasks);
  const failed = results.find((r) => r.status === "rejected");
  showError(failed ? failed.reason : null);
  document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
}

async function start() {
  const who = await api("/dashboard/api/whoami");
  operator = who.operator;
  document.getElementById("who").textContent = who.operator ? "operator" : `tenant ${who.tenant ?? "(all)"}`;
  for (const e of document.querySelectorAll(".operator")) e.hidden = !operator;
  document.getElementById("job-form").onsubmit = (ev) => {
    ev.preventDefault();
    location.hash = `job=${encodeURIComponent(document.getElementById("job-id").value.trim())}`;
  };
  window.addEventListener("hashchange", () => refresh());
  await refresh();
  setInterval(() => refresh(), REFRESH_MS);
}

document.addEventListener("DOMContentLoaded", () => start().catch(showError));
