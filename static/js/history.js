// Lag history page: loads /history/data.json for a group and range and draws it with
// plotly.js (served from static, no CDN); runs the lag job and polls its progress. Every
// 10 s it asks the job endpoint for the newest complete window (the lag service keeps it
// moving) and redraws when it moved; From/To follow the data until the user sets them.
// An ES module: the number format and element builder are the live page's (common/); the
// marks' labels and the freshness line are history/marks.js (pure, unit-tested).
import { el } from "./common/dom.js";
import { fmt } from "./common/format.js";
import { gapSpans, heatmapBricks, withGaps } from "./history/gaps.js";
import { REBALANCE_COLOUR, faultMark, freshness, markLabels, rebalanceMark } from "./history/marks.js";

const page = document.getElementById("history");
if (page) start(page);

function start(root) {
  const $ = (id) => document.getElementById(id);
  const STATUS = ["OK", "WARN", "STALL", "STOP", "REWIND"];
  const STATUS_COLORS = ["#2e9e44", "#e0a800", "#e8590c", "#c92a2a", "#7048e8"];
  const csrf = () => (root.querySelector("input[name=csrfmiddlewaretoken]") || {}).value || "";
  let polling = null;
  let lastMarks = [];        // the faults and hand-offs of the range drawn
  let newestWindow = null;   // the marker last drawn
  let pinned = false;        // the user set From/To: keep them
  const WATCH_MS = 10000;

  // datetime-local inputs hold UTC wall-clock time (the page says so).
  const toInput = (iso) => (iso ? iso.replace("Z", "").slice(0, 19) : "");
  const fromInput = (value) => (value ? value + (value.length === 16 ? ":00" : "") + "Z" : "");

  function message(text, isError) {
    const line = $("h-message");
    line.textContent = text || "";
    line.className = isError ? "error" : "notice";
  }

  function params() {
    const p = new URLSearchParams({ group: $("h-group").value });
    if ($("h-from").value) p.set("from", fromInput($("h-from").value));
    if ($("h-to").value) p.set("to", fromInput($("h-to").value));
    return p;
  }

  // Each link of `links` (one per format, data-fmt) to `base` + FMT + the query; the HTML
  // one downloads rather than opens.
  function setReportLinks(links, base, query) {
    links.forEach((a) => {
      const p = query();
      if (a.dataset.fmt === "html") p.set("download", "1");
      a.href = base + a.dataset.fmt + "?" + p.toString();
    });
  }

  function updateReportLinks() {
    setReportLinks(document.querySelectorAll(".history-downloads a"), root.dataset.reportUrl, params);
  }

  async function getJson(url) {
    const r = await fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" });
    const body = await r.json().catch(() => ({ error: r.statusText }));
    if (!r.ok) throw new Error(body.error || r.statusText);
    return body;
  }

  async function loadGroups() {
    const data = await getJson(root.dataset.groupsUrl);
    const select = $("h-group");
    const current = select.value;
    select.innerHTML = "";
    data.groups.forEach((g) => select.appendChild(el("option", { value: g.group, "data-first": g.first, "data-last": g.last }, g.group)));
    if (current) select.value = current;
    unprocessed = data.unprocessed_recordings || 0;
    showPending();
    showJob(data.job);
    if (!data.groups.length) message("No lag history yet: record a scenario, then run the lag job.");
    return data;
  }

  // The axes make room for their labels (a queue's TOPIC@BROKER:QID is long); a legend of
  // `legendItems` below the chart gets rows of its own instead of squeezing the plot.
  const MARGIN = { l: 90, r: 20, t: 40, b: 50 };
  const PLOT_HEIGHT = 220, LEGEND_ROW_PX = 20, LEGEND_ITEM_PX = 170;
  function layout(chartId, title, extra, legendItems) {
    const width = $(chartId).clientWidth || 600;
    const rows = legendItems ? Math.ceil(legendItems / Math.max(1, Math.floor((width - 40) / LEGEND_ITEM_PX))) : 0;
    const bottom = MARGIN.b + rows * LEGEND_ROW_PX;
    return Object.assign({ title: { text: title, font: { size: 14 } }, margin: { ...MARGIN, b: bottom },
                           xaxis: { type: "date", automargin: true }, yaxis: { automargin: true },
                           showlegend: Boolean(legendItems),
                           legend: { orientation: "h", x: 0, y: -40 / PLOT_HEIGHT, yanchor: "top" },
                           height: PLOT_HEIGHT + MARGIN.t + bottom }, extra || {});
  }

  // The plot's time range: every window and mark drawn.
  function timeRange(data) {
    const times = Object.values(data.queues).flatMap((q) => q.t).concat(data.group_series.t,
      data.rebalances.map((r) => r.end), (data.marks || []).map((m) => m.t)).map(Date.parse).filter((t) => !isNaN(t));
    return times.length ? [Math.min(...times), Math.max(...times)] : [Date.now() - 1, Date.now()];
  }

  // Rebalances (dotted), flow control (bands) and the faults the user injected (solid, in
  // their colour; strategy switches among them), each a line; their labels, one per cluster
  // of close marks (history/marks.js), in one row from the top: labels never overprint.
  function markers(data, chartId) {
    const shapes = [], marks = [];
    data.rebalances.forEach((r) => {
      shapes.push({ type: "line", x0: r.end, x1: r.end, yref: "paper", y0: 0, y1: 1, line: { dash: "dot", color: REBALANCE_COLOUR } });
      marks.push(rebalanceMark(r));
    });
    data.flow_control.forEach((f) => {
      shapes.push({ type: "rect", x0: f.start, x1: f.end, yref: "paper", y0: 0, y1: 1, fillcolor: "#e8590c",
                    opacity: 0.12, line: { width: 0 } });
    });
    (data.marks || []).filter((m) => m.kind === "fault").forEach((m) => {
      const colour = FAULT_COLOURS[m.name] || "#868e96";
      shapes.push({ type: "line", x0: m.t, x1: m.t, yref: "paper", y0: 0, y1: 1, line: { color: colour, width: 1.5 } });
      marks.push(faultMark(m, colour));
    });
    shapes.push(...gapShapes(data));
    const [from, to] = timeRange(data);
    const plotPixels = ($(chartId).clientWidth || 600) - MARGIN.l - MARGIN.r;
    const annotations = markLabels(marks, from, to, plotPixels).map((l) => ({
      x: l.x, y: 1, yref: "paper", text: l.text, hovertext: l.hovertext, showarrow: false, textangle: -90,
      xanchor: "right", yanchor: "top", font: { size: 10, color: l.colour }, bgcolor: "rgba(255,255,255,0.85)",
      captureevents: true }));
    return { shapes, annotations };
  }

  // Spans with no recordings (the lab was stopped): shaded grey, so neither the open line
  // nor the axis's zero line through them reads as a measured value.
  function gapShapes(data) {
    return gapSpans(data.group_series, data.res).map((g) => ({
      type: "rect", x0: g.from, x1: g.to, yref: "paper", y0: 0, y1: 1, fillcolor: "#adb5bd", opacity: 0.25,
      line: { width: 0 }, layer: "above", label: { text: "not recorded", font: { size: 10, color: "#495057" },
                                                  textposition: "bottom center" } }));
  }

  const FAULT_COLOURS = { strategy: "#7048e8", kill: "#c92a2a", stop: "#495057", hang: "#e8590c", cut: "#d6336c",
                          slow: "#f08c00", fail: "#f08c00", resume: "#2e9e44" };

  // Room on the left for the longest queue label of the status chart (~6.5 px a character).
  const labelMargin = (labels) => Math.max(MARGIN.l, 16 + 6.5 * Math.max(0, ...labels.map((l) => l.length)));

  function draw(data) {
    const labels = Object.keys(data.queues);
    // The lines stay open where nothing was recorded (history/gaps.js).
    const lines = Object.fromEntries(labels.map((q) => [q, withGaps(data.queues[q], data.res)]));
    Plotly.react("chart-queue-lag", labels.map((q) => ({
      x: lines[q].t, y: lines[q].lag, name: q, mode: "lines", customdata: lines[q].owner,
      hovertemplate: "%{y} msgs (owner %{customdata})<extra>" + q + "</extra>",
    })), layout("chart-queue-lag", "Lag per queue (" + data.res + " windows; dotted: rebalances, bands: flow control)",
      markers(data, "chart-queue-lag"), labels.length));
    const g = withGaps(data.group_series, data.res);
    const groupKeys = ["lag", "max_lag", "avg_lag", "p95_lag"];
    // p95 dotted: over a 10-s window of 10 samples it is the max, and a solid line on top
    // would hide the max's.
    Plotly.react("chart-group-lag", groupKeys.map((k) => ({
      x: g.t, y: g[k], name: k, mode: "lines", line: k === "p95_lag" ? { dash: "dot", width: 2.5 } : {} })), layout("chart-group-lag", "Group lag (sum over queues)",
      markers(data, "chart-group-lag"), groupKeys.length));
    Plotly.react("chart-time-lag", labels.map((q) => ({
      x: lines[q].t, y: lines[q].time_lag_ms, name: q, mode: "lines" })),
      layout("chart-time-lag", "Time lag per queue (ms behind)", { shapes: gapShapes(data) }, labels.length));
    // One brick per window, from its start to its end, and one empty brick per gap.
    const bricks = heatmapBricks(Array.from(new Set(labels.flatMap((q) => data.queues[q].t))).sort(), data.res);
    const z = labels.map((q) => {
      const byT = {}; data.queues[q].t.forEach((t, i) => { byT[t] = STATUS.indexOf(data.queues[q].status[i]); });
      return bricks.columns.map((t) => (t !== null && t in byT ? byT[t] : null));
    });
    const n = STATUS.length - 1;
    const status = layout("chart-status", "Status per queue", { shapes: gapShapes(data) });
    Plotly.react("chart-status", [{ type: "heatmap", x: bricks.edges, y: labels, z: z, zmin: 0, zmax: n,
      colorscale: STATUS_COLORS.map((c, i) => [i / n, c]),
      colorbar: { tickvals: STATUS.map((_, i) => i), ticktext: STATUS } }],
      { ...status, height: Math.max(240, 24 * labels.length + 120), margin: { ...status.margin, l: labelMargin(labels) },
        yaxis: { automargin: true, type: "category" } });
  }

  function followData() {
    const o = $("h-group").selectedOptions[0];
    if (o && !pinned) { $("h-from").value = toInput(o.dataset.first); $("h-to").value = toInput(o.dataset.last); }
  }

  // -- two ranges side by side (/reports/compare.FMT, compare.py)

  const compareBox = root.querySelector(".history-compare");
  function compareParams() {
    const p = new URLSearchParams({ group: $("h-group").value });
    ["a", "b"].forEach((r) => ["from", "to"].forEach((end) => {
      const v = $("h-" + r + "-" + end).value;
      if (v) p.set(r + "_" + end, fromInput(v));
    }));
    return p;
  }

  function updateCompareLinks() {
    setReportLinks(compareBox.querySelectorAll(".compare-downloads a"), compareBox.dataset.compareUrl, compareParams);
  }

  const COMPARE_ROWS = [["windows", "10-s windows"], ["lag_avg", "lag, average"], ["lag_p95", "lag, p95"], ["lag_max", "lag, max"],
    ["time_lag_avg_ms", "time lag, average (ms)"], ["time_lag_max_ms", "time lag, max (ms)"],
    ["rebalances", "rebalances that changed an assignment"], ["queues_moved", "queues handed off between consumers"], ["duplicates", "messages consumed twice"],
    ["faults", "faults"], ["strategy_switches", "strategy switches"]];

  async function runCompare() {
    updateCompareLinks();
    const out = $("h-compare-result");
    try {
      const data = await getJson(compareBox.dataset.compareUrl + "json?" + compareParams().toString());
      const [a, b] = data.ranges;
      const rows = COMPARE_ROWS.map(([key, title]) => el("tr", { "data-figure": key }, el("th", { scope: "row" }, title),
        [a, b].map((r) => el("td", { "data-range": r.range }, fmt(r[key], 1)))));
      out.replaceChildren(el("table", { class: "compare-table", "data-role": "compare" },
        el("thead", {}, el("tr", {}, el("th"), el("th", {}, "A"), el("th", {}, "B"))), el("tbody", {}, rows)));
    } catch (e) {
      out.replaceChildren(el("p", { class: "error" }, e.message));
    }
  }

  // A: the ten minutes before the last strategy switch drawn, B: the ten after.
  function aroundLastSwitch() {
    const switches = lastMarks.filter((m) => m.kind === "fault" && m.name === "strategy");
    if (!switches.length) return message("No strategy switch in the range shown.", true);
    const t = Date.parse(switches[switches.length - 1].t);
    const iso = (ms) => new Date(ms).toISOString().replace(/\.\d+Z$/, "Z");
    $("h-a-from").value = toInput(iso(t - 600000)); $("h-a-to").value = toInput(iso(t));
    $("h-b-from").value = toInput(iso(t)); $("h-b-to").value = toInput(iso(t + 600000));
    runCompare();
  }

  async function load(quiet) {
    updateReportLinks();
    if (!$("h-group").value) return;
    const p = params(); p.set("res", $("h-res").value);
    try {
      if (!quiet) message("loading...");
      const data = await getJson(root.dataset.dataUrl + "?" + p.toString());
      lastMarks = data.marks || [];
      draw(data);
      message(Object.keys(data.queues).length ? "" : "No windows in this range.");
    } catch (e) {
      message(e.message, true);
    }
  }

  function showJob(job) {
    if (!job) return;
    $("h-job-progress").value = job.total ? job.done / job.total : 0;
    let label = job.state === "idle" ? "" : job.state + (job.total ? " " + job.done + "/" + job.total : "");
    if (job.label && job.state === "running") label += " - " + job.label;
    if (job.error) label += " - " + job.error;
    $("h-job-label").textContent = label;
    $("h-job").disabled = job.state === "running" || root.dataset.canRun !== "1";
    if (job.state === "running" && !polling) polling = setInterval(poll, 1000);
    showService(job.service, job.skipped || []);
  }

  // How fresh the history is (history/marks.js freshness): the service's line and the
  // backlog never contradict each other - the backlog is shown only when nothing folds it
  // in soon (no service, or one far behind).
  let unprocessed = 0, lastService = null;
  function showPending() {
    const said = freshness(lastService, unprocessed, Date.now());
    $("h-pending").textContent = said.pending;
    const line = $("h-service");
    line.textContent = said.service;
    line.className = said.error ? "error" : "hint";
  }

  function showService(service, skipped) {
    if (!service) return;
    lastService = service;
    const bad = $("h-skipped");
    if (bad) {
      const last = skipped[skipped.length - 1];
      bad.textContent = last ? `skipped ${skipped.length} unreadable recording file(s), last ${last.file} (${last.reason})` : "";
      bad.title = skipped.map((s) => `${s.file}: ${s.reason}`).join("\n");
    }
    showPending();
  }

  // The light poll: redraw only when the newest complete window moved.
  async function watch() {
    try {
      const job = await getJson(root.dataset.jobUrl);
      showJob(job);
      if (job.newest_window_end && job.newest_window_end !== newestWindow) {
        newestWindow = job.newest_window_end;
        await loadGroups();
        followData();
        await load(true);
      }
    } catch (e) {
      message(e.message, true);
    }
  }

  async function poll() {
    try {
      const job = await getJson(root.dataset.jobUrl);
      showJob(job);
      if (job.state !== "running") {
        clearInterval(polling); polling = null;
        if (job.state === "done") { await loadGroups(); await load(); }
      }
    } catch (e) {
      message(e.message, true);
    }
  }

  async function runJob() {
    $("h-job").disabled = true;
    const r = await fetch(root.dataset.jobUrl, { method: "POST", credentials: "same-origin",
      headers: { "X-CSRFToken": csrf(), Accept: "application/json" } });
    const body = await r.json().catch(() => ({}));
    if (!r.ok && r.status !== 409) message(body.error || r.statusText, true);
    showJob(body);
    if (!polling) polling = setInterval(poll, 1000);
  }

  $("h-load").addEventListener("click", load);
  $("h-compare").addEventListener("click", runCompare);
  $("h-around-switch").addEventListener("click", aroundLastSwitch);
  ["h-a-from", "h-a-to", "h-b-from", "h-b-to"].forEach((id) => $(id).addEventListener("change", updateCompareLinks));
  $("h-job").addEventListener("click", runJob);
  $("h-group").addEventListener("change", () => { pinned = false; followData(); load(); });
  ["h-from", "h-to"].forEach((id) => $(id).addEventListener("change", () => {
    pinned = Boolean($("h-from").value || $("h-to").value);   // cleared both: follow the data again
    updateReportLinks();
  }));
  loadGroups().then(() => { followData(); return load(); })
    .then(watch).catch((e) => message(e.message, true))
    .finally(() => setInterval(watch, WATCH_MS));
}
