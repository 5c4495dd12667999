// The plotly charts: each group's ProcessQueue depth, and the lab's flow-control events.
// Plotly redraws are the expensive part (tens of ms each, more on a busy machine): at most
// twice a second, and spaced so that they take at most a ninth of the main thread.
import { setText } from "../common/dom.js";
import { MIB, fmt } from "../common/format.js";
import { colourOf } from "./colours.js";
import { FLOW_WINDOW_MS, lab } from "./model.js";
import { THRESHOLDS, deepest, ownerIndex, pqTotals, queuesOf } from "./queues.js";

const CHART_INTERVAL_MS = 500, CHART_SHARE = 1 / 9;
let chartTimer = null, lastChartDraw = 0, lastChartCost = 0, flowShown = -1;

// Plotly's "responsive" follows the window only; cards also resize when a group comes or goes.
const resizer = new ResizeObserver((entries) => {
  for (const entry of entries) if (entry.target.data) Plotly.Plots.resize(entry.target);
});
resizer.observe(document.getElementById("flow-chart"));
export const followSize = (chart) => resizer.observe(chart);

// Called on every render: the charts are redrawn on their own, slower, clock.
export function scheduleCharts() {
  const interval = Math.max(CHART_INTERVAL_MS, lastChartCost / CHART_SHARE);
  if (!chartTimer) chartTimer = setTimeout(drawCharts, Math.max(0, interval - (performance.now() - lastChartDraw)));
}

function drawCharts() {
  chartTimer = null;
  const started = performance.now();
  for (const g of Object.values(lab.groups)) drawPqChart(g);
  if (flowShown !== lab.flowVersion) drawFlowChart();
  lastChartDraw = performance.now();
  lastChartCost = lastChartDraw - started;
}

// Bars for at most this many queues: a plotly redraw costs ~0.4 ms per bar (100 ms at
// 256 queues on 2 cores, a long task twice a second) and 1024 bars have no readable labels.
const PQ_CHART_MAX_BARS = 48;

// ProcessQueue depth per queue against RocketMQ's flow-control thresholds; in a large
// group, of the deepest queues only (the grid marks every queue over a threshold).
function drawPqChart(g) {
  const div = document.getElementById(`pq-${g.name}`);
  if (!div || !window.Plotly) return;
  const all = queuesOf(g, lab.topics[g.topic]);
  const holders = ownerIndex(g, all);
  const totalsOf = new Map(all.map((l) => [l, pqTotals(g, l, holders.get(l))]));
  const queues = deepest(all, totalsOf, PQ_CHART_MAX_BARS);
  const caption = div.previousElementSibling;
  setText(caption, queues.length < all.length ? `ProcessQueues: the ${queues.length} deepest of ${all.length} queues` : "");
  const totals = queues.map((l) => totalsOf.get(l));
  const colour = queues.map((l) => holders.get(l)).map((o) => (o.length === 1 ? colourOf(o[0]) : o.length ? "#d33" : "#bbb"));
  const drawn = JSON.stringify([queues, totals, colour]);
  if (div.drawn === drawn) return;   // the same bars: no plotly work
  div.drawn = drawn;
  const panels = [
    ["cached messages", totals.map((t) => t.cached_count), THRESHOLDS.cached_count],
    ["cached MiB", totals.map((t) => t.cached_bytes / MIB), THRESHOLDS.cached_mib],
    ["span (max − min offset)", totals.map((t) => t.span), THRESHOLDS.span],
  ];
  const data = panels.map(([name, y], i) => ({
    type: "bar", x: queues, y, name, xaxis: `x${i + 1}`, yaxis: `y${i + 1}`, marker: { color: colour },
    hovertemplate: `%{x}: %{y}<extra>${name}</extra>`,
  }));
  const layout = {
    height: 190, margin: { l: 44, r: 10, t: 26, b: 54 }, showlegend: false, bargap: 0.25,
    grid: { rows: 1, columns: 3, pattern: "independent", xgap: 0.12 },
    font: { size: 11 }, paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "#fff",
    annotations: panels.map(([name], i) => ({ text: name, xref: `x${i + 1} domain`, yref: `y${i + 1} domain`, x: 0, y: 1.16, showarrow: false, xanchor: "left", font: { size: 11, color: "#555" } })),
    shapes: panels.map(([, , limit], i) => ({
      type: "line", xref: `x${i + 1} domain`, x0: 0, x1: 1, yref: `y${i + 1}`, y0: limit, y1: limit,
      line: { color: "#d33", width: 1.5, dash: "dash" },
    })),
  };
  panels.forEach(([, y, limit], i) => {
    layout[`yaxis${i + 1}`] = { range: [0, Math.max(limit * 1.1, ...y) ], rangemode: "tozero", gridcolor: "#eee" };
    layout[`xaxis${i + 1}`] = { tickangle: -45, type: "category" };
  });
  Plotly.react(div, data, layout, { displayModeBar: false, responsive: true });
}

const FLOW_COLOURS = { count: "#e8871e", size: "#9b4dca", span: "#d6457a", all: "#2f6fdf" };

function drawFlowChart() {
  flowShown = lab.flowVersion;
  const div = document.getElementById("flow-chart");
  const counter = document.getElementById("flow-count");
  counter.dataset.count = String(lab.flow.length);
  counter.textContent = `${lab.flow.length} event${lab.flow.length === 1 ? "" : "s"} in the last ${FLOW_WINDOW_MS / 60000} min`;
  if (!window.Plotly) return;
  const reasons = [...new Set(lab.flow.map((e) => e.reason || "?"))].sort();
  const data = reasons.map((reason) => {
    const events = lab.flow.filter((e) => (e.reason || "?") === reason);
    return {
      type: "scatter", mode: "markers", name: reason,
      x: events.map((e) => new Date(e.ts)),
      y: events.map((e) => `${e.group} ${e.client_id}`),
      text: events.map((e) => `${e.queue || ""} ${reason}: ${fmt(e.value)} ≥ ${fmt(e.threshold)}`),
      hovertemplate: "%{y}<br>%{text}<extra></extra>",
      marker: { color: FLOW_COLOURS[reason] || "#666", size: 8, symbol: "line-ns-open", line: { width: 2 } },
    };
  });
  Plotly.react(div, data, {
    height: 220, margin: { l: 110, r: 10, t: 10, b: 30 }, font: { size: 11 },
    paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "#fff", legend: { orientation: "h", y: -0.2 },
    // At least the last minute, so a burst of events does not fill the whole axis.
    xaxis: { type: "date", gridcolor: "#eee",
             range: [new Date(Math.min(lab.flow.length ? lab.flow[0].ts : Infinity, Date.now() - 60_000)), new Date(Date.now() + 2_000)] }, yaxis: { type: "category", automargin: true },
    annotations: lab.flow.length ? [] : [{ text: "no flow control so far", showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5, font: { color: "#888" } }],
  }, { displayModeBar: false, responsive: true });
}
