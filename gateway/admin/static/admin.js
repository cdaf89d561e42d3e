// turnout admin: live parts of the server-rendered pages. No framework, no build step; every value
// from the API is put into the page with textContent, never parsed as HTML.
"use strict";

const csrf = document.querySelector('meta[name="csrf-token"]').content;

async function api(path, options = {}) {
  const response = await fetch(path, { credentials: "same-origin", ...options });
  if (response.status === 401) { window.location = "/admin/login"; throw new Error("logged out"); }
  const body = await response.json();
  if (!response.ok) throw new Error(body.error ? body.error.message : response.statusText);
  return body;
}

function post(path, payload) {
  return api(path, {
    method: "POST",
    headers: { "content-type": "application/json", "x-csrf-token": csrf },
    body: JSON.stringify(payload || {}),
  });
}

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const cell of cells) tr.appendChild(cell instanceof Node ? cell : el("td", cell ?? "–"));
  return tr;
}

function clock(at) { return new Date(at * 1000).toLocaleTimeString([], { hour12: false }); }
function fixed(x) { return x === null || x === undefined ? "–" : Number(x).toFixed(3); }

// Decisions: newest first, refreshed every second with the filters in the form.
function decisionRow(d) {
  const chosen = (d.candidates || []).find((c) => c.backend === d.chosen) || {};
  const link = el("td");
  const a = el("a", clock(d.at));
  a.href = "/admin/decisions/" + encodeURIComponent(d.request_id);
  link.appendChild(a);
  const status = el("td", d.status);
  if (d.error) status.appendChild(el("span", " " + d.error, "error"));
  const tr = row([
    link, d.model, d.session_name || d.session || "–", d.endpoint,
    (d.chosen || "–") + (d.slot !== null && d.slot !== undefined ? "/" + d.slot : ""),
    d.reason, fixed(chosen.predicted_ttft_s), fixed(d.outcome && d.outcome.ttft_s),
    (chosen.expected_cached_tokens ?? "–") + " / " + (d.outcome ? d.outcome.cached_tokens : "–"),
    (d.candidates || []).map((c) => `${c.backend} ${fixed(c.predicted_ttft_s)}s/${c.expected_cached_tokens ?? "–"}`).join(" · "),
    status,
  ]);
  tr.dataset.id = d.request_id;
  return tr;
}

async function refreshDecisions() {
  const params = new URLSearchParams(new FormData(document.getElementById("filters")));
  for (const [key, value] of [...params]) if (!value) params.delete(key);
  params.set("limit", "100");
  const body = await api("/admin/api/decisions?" + params);
  const tbody = document.querySelector("#decisions tbody");
  tbody.replaceChildren(...body.data.map(decisionRow));
}

// Overview: each backend's live numbers.
function backendSection(b) {
  const section = el("section", null, "backend");
  section.dataset.backend = b.id;
  const h2 = el("h2", b.id + " ");
  h2.appendChild(el("small", b.kind));
  h2.appendChild(el("span", b.health, "health " + b.health));
  if (b.drained) h2.appendChild(el("span", "drained", "health drained"));
  if (b.asleep) { const s = el("span", b.asleep.split(":")[0], "health asleep"); s.title = b.asleep; h2.appendChild(s); }
  if (b.circuit !== "closed") h2.appendChild(el("span", "circuit " + b.circuit, "health down"));
  section.appendChild(h2);
  let line = "models: " + b.models.join(", ") + " · running " + b.running + " · waiting " + b.queued;
  if (b.kv_usage !== null) line += " · KV " + Math.round(b.kv_usage * 100) + "%";
  section.appendChild(el("p", line));
  (b.warnings || []).forEach((w) => section.appendChild(el("p", w, "warning")));
  const table = (head, rows, className) => {
    const t = el("table", null, className);
    const thead = el("thead");
    thead.appendChild(row(head.map((h) => el("th", h))));
    const tbody = el("tbody");
    rows.forEach((r) => tbody.appendChild(row(r)));
    t.append(thead, tbody);
    return t;
  };
  if (b.slots.length) {
    section.appendChild(table(["slot", "state", "session", "tokens", "idle"],
      b.slots.map((s) => [s.id, s.busy ? "busy" : "idle", s.session_name || s.session || "–", s.tokens, s.idle_s ?? "–"]), "slots"));
  }
  section.appendChild(table(["model", "prefill tok/s (prior)", "decode tok/s (prior)", "samples", "set aside"],
    b.learned.map((l) => [l.model, `${l.prefill_tok_s} (${l.prefill_prior})`, `${l.decode_tok_s} (${l.decode_prior})`, l.samples, l.set_aside || "–"]), "learned"));
  section.appendChild(table(["window", "req/min", "TTFT p50", "TTFT p90", "cache hit"],
    Object.entries(b.activity).map(([w, a]) => [w, a.requests_per_min, a.ttft_p50_s ?? "–", a.ttft_p90_s ?? "–", a.cache_hit ?? "–"]), "activity"));
  return section;
}

async function refreshOverview() {
  const body = await api("/admin/api/overview");
  document.getElementById("backends").replaceChildren(...body.backends.map(backendSection));
  document.getElementById("profile").textContent = body.profile;
}

// Charts: predicted vs actual TTFT per request, cache-hit ratio per minute; plain SVG.
const SVG = "http://www.w3.org/2000/svg";

const CHART = { width: 440, height: 180, left: 46, right: 8, top: 8, bottom: 22 };

function niceCeil(value) {  // 1, 2 or 5 times a power of ten, at least value
  const power = 10 ** Math.floor(Math.log10(value));
  return [1, 2, 5, 10].map((m) => m * power).find((v) => v >= value * (1 - 1e-9));
}

function svgEl(name, attrs, className, text) {
  const node = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  if (className) node.setAttribute("class", className);
  if (text !== undefined) node.textContent = text;
  return node;
}

function clockLabel(seconds, precise = false) {  // HH:MM, or HH:MM:SS where minutes would repeat
  return new Date(seconds * 1000).toTimeString().slice(0, precise ? 8 : 5);
}

// A line chart with its axes: y from 0 to yMax (given, or the data's rounded up), three labelled
// gridlines; x from the first point to the last, five times under the axis.
function chart(title, series, legend, options = {}) {
  const { width, height, left, right, top, bottom } = CHART;
  const plotW = width - left - right, plotH = height - top - bottom;
  const box = el("div", null, "chart");
  box.appendChild(el("h2", title));
  const svg = svgEl("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": title });
  const xs = series.flatMap((s) => s.points.map(([x]) => x));
  const ys = series.flatMap((s) => s.points.map(([, y]) => y)).filter((y) => y !== null && y !== undefined);
  const yMax = options.yMax ?? niceCeil(Math.max(...ys, 1e-3));
  const format = options.format ?? ((v) => String(+v.toPrecision(3)));
  for (const fraction of [0, 0.5, 1]) {
    const y = top + plotH - fraction * plotH;
    svg.appendChild(svgEl("line", { x1: left, x2: left + plotW, y1: y, y2: y }, fraction ? "grid" : "axis"));
    svg.appendChild(svgEl("text", { x: left - 5, y: y + 4, "text-anchor": "end" }, "tick", format(fraction * yMax)));
  }
  svg.appendChild(svgEl("line", { x1: left, x2: left, y1: top, y2: top + plotH }, "axis"));
  const [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  const span = Math.max(x1 - x0, 1);
  for (const fraction of [0, 0.25, 0.5, 0.75, 1]) {  // the times it spans: its ends and three between
    const anchor = fraction === 0 ? "start" : fraction === 1 ? "end" : "middle";
    const x = left + fraction * plotW;
    if (fraction > 0 && fraction < 1) {
      svg.appendChild(svgEl("line", { x1: x, x2: x, y1: top + plotH, y2: top + plotH + 4 }, "axis"));
    }
    const label = clockLabel(x0 + fraction * span, span < 600);
    svg.appendChild(svgEl("text", { x, y: height - 6, "text-anchor": anchor }, "tick", label));
  }
  const place = ([x, y]) => [left + ((x - x0) / span) * plotW, top + plotH - (Math.min(y, yMax) / yMax) * plotH];
  for (const s of series) {
    const points = s.points.filter(([, y]) => y !== null && y !== undefined).map(place);
    svg.appendChild(svgEl("polyline", { points: points.map((p) => p.join(",")).join(" ") }, s.className));
    for (const [cx, cy] of points) {  // one dot per value
      svg.appendChild(svgEl("circle", { cx, cy, r: 2.5 }, s.className + " dot"));
    }
  }
  box.appendChild(svg);
  box.appendChild(el("p", legend, "legend"));
  return box;
}

async function refreshCharts() {
  const body = await api("/admin/api/series?minutes=60");
  const boxes = [];
  for (const [backend, line] of Object.entries(body.backends)) {
    boxes.push(chart(backend + ": TTFT (s)", [
      { className: "predicted", points: line.ttft.map(([at, predicted]) => [at, predicted]) },
      { className: "actual", points: line.ttft.map(([at, , actual]) => [at, actual]) },
    ], "dashed: predicted, solid: actual, per request"));
    const cache = chart(backend + ": cache-hit ratio", [{ className: "cache", points: line.cache }],
      "cached / prompt tokens, per minute", { yMax: 1, format: (v) => Math.round(v * 100) + "%" });
    boxes.push(cache);
  }
  if (boxes.length) document.getElementById("charts").replaceChildren(...boxes);
}

// Policy: switch profile, drain and undrain, pin a model group, switch a residency set's GPUs.
function policyActions() {
  const message = document.getElementById("message");
  const act = async (path, payload) => {
    try { await post(path, payload); window.location.reload(); } catch (error) { message.textContent = error.message; }
  };
  document.getElementById("switch-profile").addEventListener("click", () =>
    act("/admin/api/policy/profile", { profile: document.getElementById("profile-select").value }));
  for (const button of document.querySelectorAll("button.drain")) {
    button.addEventListener("click", () => act(
      "/admin/api/backends/" + encodeURIComponent(button.dataset.backend) + (button.dataset.drained === "1" ? "/undrain" : "/drain")));
  }
  const group = (button) => "/admin/api/groups/" + encodeURIComponent(button.dataset.group);
  for (const button of document.querySelectorAll("button.pin")) {
    const select = document.querySelector(`select.pin-member[data-group="${CSS.escape(button.dataset.group)}"]`);
    button.addEventListener("click", () => act(group(button) + "/pin", { member: select.value }));
  }
  for (const button of document.querySelectorAll("button.unpin")) {
    button.addEventListener("click", () => act(group(button) + "/unpin"));
  }
  for (const button of document.querySelectorAll("button.residency-switch")) {
    const set = button.dataset.set;
    const select = document.querySelector(`select.residency-target[data-set="${CSS.escape(set)}"]`);
    const phase = button.parentElement.querySelector(".residency-phase");
    button.addEventListener("click", async () => {
      try {
        await post("/admin/api/residency/" + encodeURIComponent(set), { wake: select.value });
        button.disabled = true;
        for (;;) {  // the switch runs in the background: show its phase until it ends
          const sets = (await api("/admin/api/residency")).data;
          const mine = sets.find((s) => s.name === set);
          if (!mine || !mine.switch) break;
          phase.textContent = mine.phase + "…";
          await new Promise((done) => setTimeout(done, 500));
        }
        window.location.reload();
      } catch (error) { message.textContent = error.message; button.disabled = false; }
    });
  }
  const record = document.getElementById("record");
  if (record) {
    record.addEventListener("click", () => act("/admin/api/record/" + (record.dataset.on === "1" ? "stop" : "start")));
  }
}

function every(ms, refresh) {
  const run = () => refresh().catch((error) => console.warn(error));
  run();
  setInterval(run, ms);
}

// Session: release its slot.
function sessionActions() {
  const button = document.getElementById("release");
  if (!button) return;  // the session holds no slot: nothing to release
  button.addEventListener("click", async () => {
    try {
      await post("/admin/api/sessions/" + encodeURIComponent(button.dataset.session) + "/release");
      window.location.reload();
    } catch (error) { document.getElementById("message").textContent = error.message; }
  });
}

// What if: replay the recording on the edited fleet, show the report.
const WHATIF_COLUMNS = [
  ["profile", null], ["n", "requests"], ["err", "errors"], ["ttft mean", "ttft_mean_s"], ["p50", "ttft_p50_s"],
  ["p90", "ttft_p90_s"], ["completion", "completion_mean_s"], ["cache hit", "cache_hit_ratio"],
  ["session", "session_completion_mean_s"], ["prefill x", "prefill_amplification"], ["backends", "backend_share"],
];

function whatifCell(value) {
  if (value === null || value === undefined) return "–";
  if (typeof value === "object") {
    return Object.entries(value).map(([k, v]) => `${k}:${Math.round(v * 100)}%`).join(" ") || "–";
  }
  return typeof value === "number" && !Number.isInteger(value) ? value.toFixed(3) : String(value);
}

function whatifEdits() {
  const edits = { minutes: Number(document.getElementById("minutes").value), remove: [], copies: [], slots: {}, windows: {} };
  const model = document.getElementById("model").value.trim();
  if (model) edits.model = model;
  for (const tr of document.querySelectorAll("table.fleet tbody tr")) {
    const id = tr.dataset.backend;
    if (!tr.querySelector("input.keep").checked) edits.remove.push(id);
    if (tr.querySelector("input.copy").checked) edits.copies.push(id);
    for (const [cls, key] of [["slots", "slots"], ["window", "windows"]]) {
      const input = tr.querySelector("input." + cls);
      if (input && input.value && input.value !== input.dataset.was) edits[key][id] = Number(input.value);
    }
  }
  return edits;
}

function whatifActions() {
  const form = document.getElementById("whatif");
  if (!form) return;
  const message = document.getElementById("message");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const button = document.getElementById("run");
    button.disabled = true;
    message.textContent = "replaying…";
    try {
      const report = await post("/admin/api/whatif", whatifEdits());
      const head = document.querySelector("#whatif-table thead tr");
      head.replaceChildren(...WHATIF_COLUMNS.map(([name]) => el("th", name)));
      const rows = Object.entries(report.profiles).map(([name, summary]) => {
        const tr = row([el("td", name), ...WHATIF_COLUMNS.slice(1).map(([, key]) => el("td", whatifCell(summary[key])))]);
        tr.dataset.profile = name;
        return tr;
      });
      document.querySelector("#whatif-table tbody").replaceChildren(...rows);
      const others = Object.entries(report.other_models || {}).map(([m, n]) => `${m} ${n}`).join(", ");
      document.getElementById("whatif-summary").textContent =
        `the ${report.requests} requests to ${report.model} of the last ${report.minutes} minutes` +
        (others ? ` (not replayed, to other models: ${others})` : "");
      document.getElementById("whatif-command").textContent = report.command;
      document.getElementById("whatif-result").hidden = false;
      message.textContent = "";
    } catch (error) {
      message.textContent = error.message;
    } finally {
      button.disabled = false;
    }
  });
}

const page = document.body.dataset.page;
if (page === "decisions") {
  document.getElementById("filters").addEventListener("submit", (event) => { event.preventDefault(); refreshDecisions(); });
  every(1000, refreshDecisions);
} else if (page === "overview") {
  every(2000, refreshOverview);
  every(5000, refreshCharts);
} else if (page === "policy") {
  policyActions();
} else if (page === "session") {
  sessionActions();
} else if (page === "whatif") {
  whatifActions();
}
