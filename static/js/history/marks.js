// What the lag history page (history.js) says beside its charts, as plain data (pure:
// unit-tested in tests/history.test.mjs): the labels of its marks, and how fresh it is.
import { clusterByGap, gapFor } from "../common/clusters.js";
import { fmt, fmtMs, shortCid } from "../common/format.js";

// A label is a column of 10-px text turned upright: labels closer than this overprint.
const LABEL_GAP_PX = 16;
const LABEL_MAX_CHARS = 26;     // a label fits half a chart's height
const HOVER_MAX_LINES = 15;

// The marks' labels for a chart drawing [fromMs, toMs] over `plotPixels`: one label per
// cluster of close marks - the first mark's text and "+N", every mark in its hover text.
// `marks`: [{ms, x, text, detail, colour}].
export function markLabels(marks, fromMs, toMs, plotPixels) {
  const gap = gapFor(Math.max(1, toMs - fromMs), plotPixels, LABEL_GAP_PX);
  return clusterByGap(marks, (m) => m.ms, gap).map((cluster) => {
    const [first] = cluster;
    const more = cluster.length > 1 ? ` +${cluster.length - 1}` : "";
    const text = first.text.length + more.length > LABEL_MAX_CHARS
      ? `${first.text.slice(0, LABEL_MAX_CHARS - more.length - 1)}…${more}` : first.text + more;
    const lines = cluster.slice(0, HOVER_MAX_LINES).map((m) => m.detail || m.text);
    if (cluster.length > HOVER_MAX_LINES) lines.push(`… and ${cluster.length - HOVER_MAX_LINES} more`);
    const colours = new Set(cluster.map((m) => m.colour));
    return { x: first.x, ms: first.ms, text, hovertext: lines.join("<br>"), colour: colours.size === 1 ? first.colour : "#333",
             count: cluster.length };
  });
}

export const REBALANCE_COLOUR = "#555";

// A rebalance that moved queues, as a mark (its label names who, shortened).
export const rebalanceMark = (r) => ({ ms: Date.parse(r.end), x: r.end, colour: REBALANCE_COLOUR,
  text: `rebalance ${shortCid(r.client_id)}`, detail: `rebalance by ${r.client_id}: ${fmt(r.duration_ms)} ms` });

// A fault the user injected (a strategy switch among them), as a mark.
export function faultMark(m, colour) {
  const what = m.name === "strategy" ? `strategy ${m.detail.strategy || ""}`
    : `${m.name} ${m.client_id ? shortCid(m.client_id) : m.detail.topic || ""}`;
  const whole = m.name === "strategy" ? what : `${m.name} ${m.client_id || m.detail.topic || ""}`;
  return { ms: Date.parse(m.t), x: m.t, colour, text: what.trim(), detail: whole.trim() };
}

// Past this the lag service is behind, not just between two passes (a pass every ~10 s).
export const BEHIND_MS = 60_000;

// The job line's two parts about freshness, never contradicting each other: `service` (the
// lag service: live, behind, paused) and `pending` (the recordings not folded in yet, said
// only when nothing folds them in soon). `service` is the job endpoint's, `unprocessed` the
// groups endpoint's count of recording files the history has not read.
export function freshness(service, unprocessed, nowMs) {
  const backlog = unprocessed ? `${fmt(unprocessed)} recording file${unprocessed === 1 ? "" : "s"} not processed yet` : "";
  if (service && service.paused) {
    return { service: `history paused: ${service.paused}`, error: true, pending: backlog };
  }
  if (!service || service.state !== "running") {
    return { service: "", error: false, pending: backlog ? `${backlog}: run the lag job` : "" };
  }
  const newest = service.newest_sample_ts;
  if (!newest) return { service: "live: the lag service is starting (its first pass folds in what was recorded)", error: false, pending: "" };
  const behind = Math.max(0, nowMs - newest);
  if (behind <= BEHIND_MS) return { service: `live: new windows every ~10 s (${fmtMs(behind)} behind)`, error: false, pending: "" };
  return { service: `live, but ${fmtMs(behind)} behind`, error: false, pending: backlog ? `${backlog}: the lag service is catching up` : "" };
}
