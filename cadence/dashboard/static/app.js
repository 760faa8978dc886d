// cadence dashboard: one page, plain JS, plotly.js; live by one server-sent-event stream.
"use strict";

// Charts: an id, a title, the metric keys (regular expressions) it draws, and optionally { group, range, markers }:
// a group's heading goes above the first of its charts a run has; range fixes the y axis; markers show points
// that no neighbour joins (a staleness bucket present at one step only).
const OFFPOLICY = "off-policy (samples behind the trainer's policy)";
const CHARTS = [
  ["reward", "reward and accuracy", [/^reward\/mean$/, /^reward\/accuracy$/, /^eval\/pass@1$/, /^eval\/success/]],
  ["lengths", "response length (tokens)", [/^response\/length_(mean|max)$/]],
  ["losses", "losses", [/^train\/(loss|pg_loss|value_loss|critic_loss|kl_loss)$/]],
  ["kl", "KL", [/^train\/(approx_kl|kl|kl_mean|mismatch_kl)$/]],
  ["entropy", "entropy", [/^train\/entropy$/]],
  ["grad", "grad norm", [/^train\/grad_norm$/]],
  ["samples", "samples/s", [/^perf\/samples_per_s$/]],
  ["tokens", "tokens/s", [/^perf\/tokens_per_s$/]],
  ["stale", "staleness (versions behind)", [/^train\/staleness_(mean|max)$/]],
  ["canaries", "canary pass rate (the measured hack rate; goal 0)", [/^agent\/canary_pass_rate$/], { range: [0, 1.05] }],
  ["offpolicy-ess", "effective sample size of π_old/μ (1: on-policy)", [/^offpolicy\/ess(_seq)?$/],
   { group: OFFPOLICY, range: [0, 1.05] }],
  ["offpolicy-masked", "share of tokens masked or truncated", [/^offpolicy\/(masked|truncated)_frac$/], { group: OFFPOLICY }],
  ["offpolicy-kl", "KL(μ ‖ π_old)", [/^offpolicy\/kl_mu_pi_old$/], { group: OFFPOLICY }],
  ["offpolicy-grad", "grad norm by staleness bucket (versions behind)", [/^offpolicy\/grad_norm_stale_/],
   { group: OFFPOLICY, markers: true }],
];
// Axes: "~g" ticks read 0.0001, 12000 and 4e-13 as such (plotly's default SI prefixes gave "400f" for a KL
// of 4e-13 and "100μ" for 1e-4). The mode bar stands upright in the right margin: across the top it
// covered the chart's title.
const YAXIS = { tickformat: "~g" };
const LAYOUT = { margin: { l: 52, r: 34, t: 28, b: 30 }, legend: { orientation: "h", y: -0.18, font: { size: 10 } },
                 font: { size: 11 }, xaxis: { title: { text: "step", standoff: 2 } }, yaxis: YAXIS,
                 modebar: { orientation: "v" } };
const CONFIG = { displaylogo: false, responsive: true };
// Plotly reads a little markup in titles, legends and hover text (<b>, <a href>): text from run files is escaped.
const title = (text) => ({ text: esc(text), x: 0, xref: "paper", xanchor: "left", font: { size: 12 } });
// reward/accuracy equals reward/mean whenever rewards are 0/1: drawn dashed over the solid mean, both stay visible.
const TRACE_STYLE = { "reward/accuracy": { line: { dash: "dash", width: 3 } } };
const COLORS = { generating: "#3d8bfd", waiting: "#c9ced8", training: "#e8743b", weight_sync: "#9b59b6",
                 evaluating: "#19a979", checkpointing: "#7f8c8d", logging: "#e6d36a" };

const state = { run: null, keys: {}, rows: 0, gen: 0, source: null, tab: "charts", group: null };
const $ = (id) => document.getElementById(id);

// Markup is built only with the `html` template tag: every value put into it is escaped (run files
// are written by the policy under training, hand edits and other tools: any field may hold markup),
// except the result of another `html` (already escaped) or an array of such results.
class Html { constructor(s) { this.s = s; } }
// (Numeric entities for quotes: plotly, which is given escaped text too, decodes those but not &quot;.)
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&#34;", "'": "&#39;" }[c]));
const part = (v) => v instanceof Html ? v.s : Array.isArray(v) ? v.map(part).join("") : esc(v);
const html = (strings, ...values) => new Html(strings.reduce((out, s, i) => out + part(values[i - 1]) + s));
const setHtml = (el, h) => { if (!(h instanceof Html)) throw new TypeError("setHtml takes html`...`"); el.innerHTML = h.s; };
const fmt = (v, d = 3) => (typeof v === "number" && Number.isFinite(v) ? +v.toFixed(d) : v ?? "");
const plotlyReady = new Promise((resolve) => {
  if (window.Plotly) resolve(); else $("plotly-js").addEventListener("load", resolve);
});
const api = async (path) => { const r = await fetch(path); if (!r.ok) throw new Error(`${path}: ${r.status}`); return r.json(); };

// ---- runs list ------------------------------------------------------------------------
function renderRuns(runs) {
  $("runs-empty").hidden = runs.length > 0;
  setHtml($("runs-table").querySelector("tbody"), html`${runs.map((r) =>
    html`<tr data-run="${r.name}" class="${r.name === state.run ? "sel" : ""}" title="${r.error || ""}">
      <td>${r.name}</td><td><span class="state ${r.state}">${r.state}</span></td>
      <td>${r.step ?? ""}${r.steps ? "/" + r.steps : ""}</td><td>${fmt(r.reward)}</td></tr>`)}`);
  const mine = runs.find((r) => r.name === state.run);
  if (mine) showStatus(mine);
}
$("runs-table").addEventListener("click", (e) => {
  const tr = e.target.closest("tr[data-run]");
  if (tr) location.hash = "#/run/" + encodeURIComponent(tr.dataset.run);
});

function showStatus(r) {
  const el = $("run-state");
  state.credit = r.credit;
  if (el.textContent !== r.state) { el.textContent = r.state; el.className = "state " + r.state; if (r.state !== "running") loadDetails(); }
  $("run-step").textContent = `step ${r.step ?? "?"}${r.steps ? " of " + r.steps : ""}`;
}

// ---- one run ------------------------------------------------------------------------
async function openRun(name) {
  state.run = name; state.rows = 0; state.gen = 0; state.keys = {}; state.group = null;
  $("home").hidden = true; $("sandbox-view").hidden = true; $("run-view").hidden = false;
  $("run-name").textContent = name; $("run-state").textContent = ""; $("run-error").hidden = true;
  document.querySelectorAll("#runs-table tr").forEach((tr) => tr.classList.toggle("sel", tr.dataset.run === name));
  await loadCharts();
  loadDetails();
  showTab(state.tab);
  connect();
}

async function loadCharts() {
  await plotlyReady;
  // Only the keys some chart draws: a run logs ~40 metrics, the charts show ~15.
  const match = CHARTS.flatMap((c) => c[2].map((p) => p.source)).join("|");
  const data = await api(`/api/runs/${encodeURIComponent(state.run)}/metrics?match=${encodeURIComponent(match)}`);
  state.rows = data.rows; state.gen = data.generation;
  const keys = Object.keys(data.series);
  $("charts").replaceChildren();
  let group;
  for (const [id, chartTitle, patterns, opts = {}] of CHARTS) {
    const mine = keys.filter((k) => patterns.some((p) => p.test(k)));
    if (!mine.length && id !== "reward") continue;
    if (opts.group && opts.group !== group) {
      const h = document.createElement("h2"); h.className = "chart-group"; h.textContent = opts.group; $("charts").appendChild(h);
    }
    group = opts.group;
    const div = document.createElement("div"); div.id = "chart-" + id; $("charts").appendChild(div);
    state.keys[id] = mine;
    const mode = opts.markers ? "lines+markers" : "lines";
    const traces = mine.map((k) => ({ x: data.series[k].x, y: data.series[k].y, name: k, mode, marker: { size: 4 }, type: "scatter", ...TRACE_STYLE[k] }));
    const yaxis = opts.range ? { ...YAXIS, range: opts.range, autorange: false } : YAXIS;
    Plotly.newPlot(div, traces, { ...LAYOUT, yaxis, title: title(chartTitle) }, CONFIG);
  }
}

function addRows(rows) {
  // A key that first appears now and that a chart draws (eval/pass@1 at an eval step, a staleness bucket's
  // first grad norm, whose chart may not be there yet): draw the charts again.
  const drawn = new Set(Object.values(state.keys).flat());
  const fresh = [...new Set(rows.flatMap(Object.keys))].filter((k) => !drawn.has(k) && CHARTS.some((c) => c[2].some((p) => p.test(k))));
  if (fresh.length) return loadCharts().then(connect);
  for (const [id, keys] of Object.entries(state.keys)) {
    const div = $("chart-" + id); if (!div) continue;
    const xs = keys.map(() => []), ys = keys.map(() => []);
    for (const row of rows) keys.forEach((k, i) => { if (k in row) { xs[i].push(row.step); ys[i].push(row[k]); } });
    const idx = keys.map((_, i) => i).filter((i) => xs[i].length);
    if (idx.length) Plotly.extendTraces(div, { x: idx.map((i) => xs[i]), y: idx.map((i) => ys[i]) }, idx);
  }
}

async function loadDetails() {
  const d = await api(`/api/runs/${encodeURIComponent(state.run)}`);
  const st = d.status || {};
  $("run-state").textContent = st.state || "unknown"; $("run-state").className = "state " + (st.state || "");
  $("run-error").hidden = !st.error;
  $("run-error-text").textContent = st.error || "";
  $("run-traceback").textContent = st.traceback || "";
  const lost = d.lost_episodes;  // a short line here; the counts and first reports under config
  $("run-lost").hidden = !lost;
  $("run-lost").textContent = lost ? `lost episodes: ${Object.entries(lost.lost).map(([k, n]) => `${k} ${n}`).join(", ") ||
    lost.reports.map((r) => r.kind).join(", ")} (the first failure of each kind is under config)` : "";
  const s = d.summary;
  setHtml($("details"), html`
    ${s ? html`<div class="card"><b>summary</b><pre>${JSON.stringify(s, null, 2)}</pre></div>` : ""}
    <div class="card"><b>checkpoints</b> ${d.checkpoints.join(", ") || html`<span class=muted>none</span>`}</div>
    ${d.reward_errors ? html`<div class="card"><b class="fail">reward errors</b><pre>${d.reward_errors}</pre></div>` : ""}
    ${d.lost_episodes ? html`<div class="card" id="lost-episodes"><b class="fail">lost episodes</b> ${
      Object.entries(d.lost_episodes.lost).map(([k, n]) => html`<span class="lost-count">${k}: ${n}</span> `)}${
      d.lost_episodes.worst_task ? html`<div class="lost-task">most often lost: task ${d.lost_episodes.worst_task.task}, ${
        d.lost_episodes.worst_task.lost} of its ${d.lost_episodes.worst_task.runs} runs (${
        d.lost_episodes.worst_task.tasks} tasks lost runs)</div>` : ""}${
      d.lost_episodes.reports.map((r) => html`<div class="lost-kind"><b>${r.kind}</b> (first)<pre>${r.text}</pre></div>`)}</div>` : ""}
    ${d.resume_changes ? html`<div class="card"><b>resume changes</b><pre>${d.resume_changes}</pre></div>` : ""}
    <div class="card"><b>config.yaml</b><pre>${d.config || ""}</pre></div>`);
}

// ---- pipeline --------------------------------------------------------------------------
async function loadPipeline() {
  await plotlyReady;
  const t = await api(`/api/runs/${encodeURIComponent(state.run)}/timeline?last_s=120`);
  const actors = Object.keys(t.spans).sort((a, b) => (a === "trainer") - (b === "trainer") || a.localeCompare(b));
  const byState = {};
  for (const a of actors) for (const s of t.spans[a]) {
    (byState[s.state] ||= { x: [], base: [], y: [], text: [] });
    const b = byState[s.state];
    b.base.push((s.t0 - t.now)); b.x.push(s.t1 - s.t0); b.y.push(a); b.text.push(s.step !== undefined ? `step ${s.step}` : "");
  }
  const bars = Object.entries(byState).map(([name, b]) => ({ type: "bar", orientation: "h", name: esc(name), ...b, y: b.y.map(esc),
    marker: { color: Object.hasOwn(COLORS, name) ? COLORS[name] : "#888" }, textposition: "none",
    hovertemplate: "%{y} " + esc(name) + " %{x:.3f}s %{text}<extra></extra>" }));
  Plotly.react("timeline", bars, { ...LAYOUT, barmode: "overlay", title: title("pipeline timeline (seconds before the latest event)"),
    xaxis: { title: { text: "s" } }, yaxis: { categoryorder: "array", categoryarray: actors.map(esc) }, legend: { orientation: "h", y: -0.2 } }, CONFIG);
  const ks = Object.keys(t.staleness);
  const shapes = t.alpha === null ? [] : [{ type: "line", x0: t.alpha + 0.5, x1: t.alpha + 0.5, yref: "paper", y0: 0, y1: 1, line: { color: "#a1231b", dash: "dash" } }];
  Plotly.react("staleness", [{ type: "bar", x: ks.map(Number), y: ks.map((k) => t.staleness[k]), marker: { color: "#3d8bfd" } }],
    { ...LAYOUT, shapes, title: title(`staleness of trained samples (alpha = ${t.alpha ?? "?"})`), xaxis: { title: { text: "versions behind", standoff: 2 }, dtick: 1 } }, CONFIG);
  const m = await api(`/api/runs/${encodeURIComponent(state.run)}/metrics?keys=buffer/depth_groups,rollout/in_flight_groups,rollout/engine_busy_fraction&max_points=1000`);
  const line = (k) => ({ x: m.series[k].x, y: m.series[k].y, name: k, mode: "lines" });
  Plotly.react("queue", ["buffer/depth_groups", "rollout/in_flight_groups"].filter((k) => m.series[k].x.length).map(line),
    { ...LAYOUT, title: title("queue depth (groups)") }, CONFIG);
  Plotly.react("busy", [line("rollout/engine_busy_fraction")], { ...LAYOUT, title: title("engine busy fraction"), yaxis: { ...YAXIS, range: [0, 1] } }, CONFIG);
}

// ---- samples and episodes -----------------------------------------------------------------
const TURN_HEAD = { call: "tool call", tool: "tool result" };  // agent runs' turns (episodes.py)
async function loadGroups() {
  const groups = await api(`/api/runs/${encodeURIComponent(state.run)}/samples`);
  setHtml($("groups"), groups.length ? html`${groups.map((g) =>
    html`<div class="item" data-step="${g.step}" data-group="${g.group_id}"><b>step ${g.step}</b> group ${g.group_id}
      ${g.turns > 1 ? html`<span class="muted">${g.turns} turns</span>` : ""}<br>
      <span class="prompt">${String(g.prompt).slice(0, 80)}</span><br>
      <span class="muted">rewards ${g.rewards.map((r) => fmt(r, 2)).join(" ")} · versions ${[...new Set(g.versions)].join(",")}</span></div>`)}`
    : html`<p class="muted">no samples logged (logging.samples_every=0?)</p>`);
}
$("groups").addEventListener("click", async (e) => {
  const it = e.target.closest(".item"); if (!it) return;
  document.querySelectorAll("#groups .item").forEach((x) => x.classList.toggle("sel", x === it));
  state.group = { step: it.dataset.step, group: it.dataset.group };  // the list may redraw; this stays
  const samples = await api(`/api/runs/${encodeURIComponent(state.run)}/samples/${encodeURIComponent(it.dataset.step)}/${encodeURIComponent(it.dataset.group)}`);
  const rhythm = ["local", "global", "coupled"].includes(state.credit);
  setHtml($("group"), html`<div class="card"><b>prompt</b><div class="prompt">${samples[0].prompt}</div></div>
    ${samples.map((s) => html`<div class="sample"><div class="meta">#${s.index} · reward <b>${fmt(s.reward)}</b> · version ${s.version}${
      s.finish_version !== null && s.finish_version !== s.version ? "→" + s.finish_version : ""} · staleness ${s.staleness} · ${s.finish_reason}${
      s.reward_error ? html` · <span class="fail">${s.reward_error}</span>` : ""}</div>${
      s.turns.map((t) => html`<div class="turn ${t.role}">${TURN_HEAD[t.role] ? html`<div class="turn-head">${TURN_HEAD[t.role]}${
        t.role === "call" ? html` <b class="call-name">${t.name}</b> <code class="call-args">${t.arguments}</code>` : ""}</div>` : ""}${
        t.tokens.map((tok, i) => t.role === "env" || t.role === "tool"
        ? html`<span class="tok" title="inserted: no loss">${tok}</span>`
        : html`<span class="tok loss" title="log mu ${t.logprobs[i] ?? ""}">${tok}</span>`)}${
        t.reward !== undefined ? html` <span class="muted turn-reward">turn reward ${fmt(t.reward)}</span>` : ""}</div>`)}${
      rhythm ? html`<button class="rhythm-btn" data-index="${s.index}">WAAD / FAI</button><div class="rhythm"><div class="rhythm-plot"></div><div class="rhythm-tokens"></div></div>` : ""}</div>`)}
    <p class="muted">Highlighted tokens carried loss (the model's own); grey turns are what the environment (or the agent: tool results) inserted.</p>`);
});
// Attention rhythm of one sample (computed by the server with the run's latest checkpoint).
$("group").addEventListener("click", async (e) => {
  const btn = e.target.closest(".rhythm-btn"); if (!btn) return;
  const sel = state.group;
  const plot = btn.nextElementSibling.firstElementChild, toks = plot.nextElementSibling;
  toks.textContent = "reading attention maps…";
  let r;
  try { r = await api(`/api/runs/${encodeURIComponent(state.run)}/rhythm/${[sel.step, sel.group, btn.dataset.index].map(encodeURIComponent).join("/")}`); }
  catch (err) { setHtml(toks, html`<span class="fail">${err.message}</span>`); return; }
  const x = r.tokens.map((t, i) => i);
  const text = r.tokens.map((t) => esc(JSON.stringify(t)));
  const credited = x.filter((i) => r.credited[i]);
  await plotlyReady;
  Plotly.newPlot(plot, [
    { x, y: r.waad, text, name: "WAAD", mode: "lines", type: "scatter" },
    { x, y: r.fai, text, name: "FAI", mode: "lines", type: "scatter", yaxis: "y2" },
    { x: credited, y: credited.map((i) => r.gamma[i]), text: credited.map((i) => text[i]), name: "credit (gamma)",
      mode: "markers", type: "scatter", yaxis: "y3", marker: { color: "#e8743b" } },
  ], { ...LAYOUT, height: 300, margin: { ...LAYOUT.margin, r: 80 }, title: title(`${r.credit} credit · ${r.checkpoint}`),
       xaxis: { title: { text: "response token", standoff: 2 } }, yaxis: { ...YAXIS, title: { text: "WAAD" } },
       yaxis2: { ...YAXIS, tickmode: "auto", showgrid: false, overlaying: "y", side: "right", title: { text: "FAI" } },
       yaxis3: { overlaying: "y", side: "right", anchor: "free", position: 0.97, showticklabels: false } }, CONFIG);
  setHtml(toks, html`<div class="turn">${r.tokens.map((t, i) => html`<span class="tok${r.credited[i] ? " credited" : ""}" title="gamma ${fmt(r.gamma[i])} · WAAD ${fmt(r.waad[i])} · FAI ${fmt(r.fai[i])}">${t}</span>`)}</div>`);
});

// ---- sandboxes ------------------------------------------------------------------------------
function renderSandboxes(services) {
  if (!services.length) return;
  $("nav-sandboxes").hidden = false;
  if (location.hash !== "#/sandboxes") return;
  const age = (s) => typeof s !== "number" ? "—" : s < 120 ? `${s.toFixed(0)} s` : `${(s / 60).toFixed(1)} min`;
  const time = (ts) => new Date(ts * 1000).toLocaleTimeString();
  const limits = (l) => l ? `${l.cpu_s} s/call · ${l.memory_mb} MB · ${l.processes} procs` : "";
  setHtml($("sandbox-view"), html`${services.map((svc) => !svc.ok ? html`<div class="card fail">${svc.url}: ${svc.error}</div>` :
    html`<div class="card"><b>${svc.url}</b> <span class="muted">${Object.entries(svc.counts).map(([k, v]) => `${k} ${v}`).join(" · ")}</span>
    <table class="boxes"><thead><tr><th>sandbox</th><th>state</th><th>generation</th><th>age</th><th>idle</th><th>calls</th><th>restarts</th><th>cpu</th><th>memory</th><th>limits (cpu · memory · processes)</th><th>last reason</th></tr></thead><tbody>
    ${svc.sandboxes.map((b) => html`<tr data-sandbox="${b.id}"><td>${b.id}</td><td><span class="state">${b.state}</span></td><td>${b.generation}</td>
      <td>${age(b.age_s)}</td><td>${age(b.idle_s)}</td><td>${b.execs}</td><td class="restarts">${b.replacements}</td>
      <td>${b.cpu_s != null ? fmt(b.cpu_s, 2) + " s" : "—"}</td><td>${b.memory_mb != null ? fmt(b.memory_mb, 1) + " MB" : "—"}</td>
      <td>${limits(b.limits)}</td><td>${b.last_reason}</td></tr>`)}</tbody></table></div>
    <div class="card"><b>recent failures</b>${svc.failures.length ? svc.failures.map((e) => html`<div class="fail">${time(e.ts)} ${e.sandbox_id} gen ${e.generation}: ${e.state}: ${e.reason}</div>`) : html` <span class=muted>none</span>`}</div>
    <div class="card"><b>event log</b><pre class="events">${svc.events.map((e) => `${time(e.ts)} ${e.sandbox_id} g${e.generation} ${e.state}: ${e.reason}`).join("\n")}</pre></div>`)}`);
}

// ---- live updates ---------------------------------------------------------------------------
function connect() {
  if (state.source) state.source.close();
  const q = state.run ? `?run=${encodeURIComponent(state.run)}&rows=${state.rows}&gen=${state.gen}` : "";
  const src = state.source = new EventSource("/api/stream" + q);
  src.onopen = () => { $("conn").textContent = "live"; };
  src.onerror = () => { $("conn").textContent = "reconnecting"; };
  src.addEventListener("runs", (e) => renderRuns(JSON.parse(e.data)));
  src.addEventListener("reset", () => loadCharts().then(connect));
  src.addEventListener("rows", (e) => { const d = JSON.parse(e.data); state.rows += d.rows.length; addRows(d.rows); });
  src.addEventListener("timeline", () => { if (state.tab === "pipeline") loadPipeline(); });
  src.addEventListener("samples", () => { if (state.tab === "samples") loadGroups(); });
  src.addEventListener("sandboxes", (e) => renderSandboxes(JSON.parse(e.data)));
}

function showTab(tab) {
  state.tab = tab;
  document.querySelectorAll("#tabs button").forEach((b) => b.classList.toggle("on", b.dataset.tab === tab));
  for (const t of ["charts", "pipeline", "samples", "config"]) $("tab-" + t).hidden = t !== tab;
  if (tab === "pipeline") loadPipeline();
  if (tab === "samples") loadGroups();
  if (tab === "charts") window.dispatchEvent(new Event("resize"));
}
$("tabs").addEventListener("click", (e) => { if (e.target.dataset.tab) showTab(e.target.dataset.tab); });

async function route() {
  const m = location.hash.match(/^#\/run\/(.+)$/);
  if (m) return openRun(decodeURIComponent(m[1]));
  state.run = null;
  $("run-view").hidden = true;
  $("home").hidden = location.hash === "#/sandboxes";
  $("sandbox-view").hidden = location.hash !== "#/sandboxes";
  if (location.hash === "#/sandboxes") renderSandboxes(await api("/api/sandboxes"));
  connect();
}
window.addEventListener("hashchange", route);
api("/api/runs").then(renderRuns);
api("/api/sandboxes").then((s) => { if (s.length) $("nav-sandboxes").hidden = false; });
route();
