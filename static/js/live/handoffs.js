// What each rebalance did to messages (consumers_app/lab/handoff.py): the strip shows the
// last 15 minutes' rebalances that moved queues, placed by time, red when they caused
// duplicates; a click opens its hand-offs - per moved queue who gave it to whom, the gap
// (nobody consumed it) or overlap (two did), the messages consumed twice (exact, from
// the consumers' own consumed offsets) and the lag spike. The totals line sums the window.
import { el, setAttr, setClass, setData, setStyle, setText } from "../common/dom.js";
import { clock, fmt, fmtMs, plural } from "../common/format.js";
import { clusterByGap, gapFor } from "../common/clusters.js";
import { request } from "./api.js";
import { changedCount } from "./queues.js";

const HANDOFF_WINDOW_MS = 15 * 60 * 1000;
// Marks whose centres are closer than this on the strip are one cluster: a cluster's head
// is 16 px wide, a mark 8 px, so two such never touch. Never less than 5 s apart either.
const MARK_GAP_PX = 18, MIN_CLUSTER_MS = 5000;
const openRebalance = new Map();   // group name -> {id, stamp, loading}

function handoffTotalsLine(t) {
  if (!t.rebalances) return "Last 15 min: no rebalance moved a queue.";
  return `Last 15 min: ${plural(t.rebalances, "rebalance")} moved ${plural(t.moved, "queue")} · ` +
    `${duplicatesText(t)} · longest gap ${fmtMs(t.gap_ms)} · longest overlap ${fmtMs(t.overlap_ms)}` +
    (t.lag_spike !== null && t.lag_spike !== undefined ? ` · biggest lag spike ${fmt(t.lag_spike)}` : "");
}

// The consumed-twice figure as every place words it: a move to or from a peer (which
// reports no consumed offsets) is "not measured", never a 0 that would claim none.
function duplicatesText(r) {
  const measured = r.moved - (r.unmeasured || 0);
  if (!measured) return "consumed twice: not measured (moves to or from a peer)";
  return `${plural(r.duplicates, "message")} consumed twice` +
    (r.unmeasured ? ` (${plural(r.unmeasured, "move")} to or from a peer not measured)` : "");
}

function rebalanceTitle(r) {
  return [`${clock(r.ts)} ${r.reason || "rebalance"}`, `${plural(r.moved, "queue")} moved among ${r.clients.join(", ")}`,
    `${duplicatesText(r)} · gap ${fmtMs(r.gap_ms)} · overlap ${fmtMs(r.overlap_ms)}${r.overlap_ongoing ? " (ongoing)" : ""}`].join("\n");
}

// The header and the totals line read the same record (the hand-offs of the window), so
// they never disagree; a consumer's rebalance that only took queues nobody held (its
// start) moved none, and says so.
export function lastRebalanceLine(g) {
  const rebalances = g.handoffs.rebalances || [];
  const r = rebalances[rebalances.length - 1];
  if (r) return `Last rebalance that moved queues ${clock(r.ts)}: ${r.reason || "rebalance"} · ` +
    `${plural(r.moved, "queue")} moved among ${r.clients.join(", ")}`;
  const c = g.lastRebalance;
  return "No rebalance has moved a queue in the last 15 min." + (c
    ? ` Last assignment change ${clock(c.ts)}${c.client_id ? ` by ${c.client_id}` : ""}: ${c.reason || "periodic"} · ${changedCount(c)} queue(s) taken or released, none from another consumer`
    : "");
}

export function showHandoffs(card, g) {
  const { totals = {}, rebalances = [] } = g.handoffs;
  const line = card.querySelector('[data-role="handoff-totals"]');
  setText(line, handoffTotalsLine(totals));
  setData(line, "duplicates", String(totals.duplicates || 0));
  setData(line, "moved", String(totals.moved || 0));
  const strip = card.querySelector('[data-role="rebalances"]');
  const now = Date.now();
  const left = (ts) => `left:${Math.max(0, Math.min(100, 100 - ((now - ts) / HANDOFF_WINDOW_MS) * 100)).toFixed(2)}%`;
  // Marks closer than MARK_GAP_PX are one cluster (a button with their count, listing them
  // on a click): marks on top of each other would hide all but the top one, and it
  // would swallow the clicks. As the strip scrolls every mark moves alike, so the clusters
  // follow from the times and the strip's width alone: rebuilt only when a rebalance
  // comes or goes, or the card is resized.
  const width = stripWidth(strip);
  const clusterMs = Math.max(MIN_CLUSTER_MS, gapFor(HANDOFF_WINDOW_MS, width, MARK_GAP_PX));
  setData(strip, "clusterMs", String(Math.round(clusterMs)));
  const clusters = clusterByGap(rebalances, (r) => r.ts, clusterMs);
  const shape = clusters.map((c) => c.map((r) => r.id).join(",")).join("|");
  if (strip.dataset.shape !== shape) {
    const openList = strip.querySelector('.rebalance-cluster:not(.closed)')?.dataset.ids;
    strip.dataset.shape = shape;
    strip.replaceChildren(...clusters.map((c) => (c.length === 1 ? rebalanceMark() : rebalanceCluster(card, c, openList))));
  }
  const open = openRebalance.get(g.name);
  for (const cluster of strip.querySelectorAll(".rebalance-cluster")) {
    const members = rebalances.filter((r) => cluster.dataset.ids.split(",").includes(String(r.id)));
    const head = cluster.querySelector(".rebalance-cluster-head");
    // At its members' middle: neighbours are at least a gap past its first and last.
    const middle = (members[0].ts + members[members.length - 1].ts) / 2;
    setStyle(cluster, left(middle));
    setClass(cluster, "late", now - middle < HANDOFF_WINDOW_MS / 2);   // its list opens leftwards
    setClass(cluster, "dupes", members.some((r) => r.duplicates > 0));
    setAttr(head, "title", `${members.length} rebalances ${clock(members[0].ts)}–${clock(members[members.length - 1].ts)}, ` +
      `${plural(members.reduce((n, r) => n + r.moved, 0), "queue")} moved: click for the list`);
  }
  const marks = [...strip.querySelectorAll(".rebalance-mark")];   // in the clusters' order
  clusters.flat().forEach((r, i) => {
    const mark = marks[i];
    const inCluster = Boolean(mark.closest(".rebalance-cluster"));
    mark.onclick = () => {
      mark.closest(".rebalance-cluster")?.classList.add("closed");   // its list would cover the panel
      openHandoff(card, g.name, r.id);
    };
    setData(mark, "rebalanceId", String(r.id));
    setData(mark, "ts", String(r.ts));
    setData(mark, "endTs", String(r.end_ts));
    setData(mark, "duplicates", String(r.duplicates));
    setData(mark, "moved", String(r.moved));
    setClass(mark, "dupes", r.duplicates > 0);
    setClass(mark, "open", Boolean(open) && open.id === r.id);
    setAttr(mark, "title", rebalanceTitle(r));
    setAttr(mark, "aria-label", `rebalance at ${clock(r.ts)}: ${plural(r.moved, "queue")} moved, ${duplicatesText(r)}`);
    setText(mark, inCluster ? `${clock(r.ts)} ${r.reason || "rebalance"} · ${r.moved} moved` : "");
    setStyle(mark, inCluster ? "" : left(r.ts));
    // An open rebalance whose figures moved on (the new owner caught up): ask again.
    if (open && open.id === r.id && !open.loading && open.stamp !== `${r.moved}|${r.duplicates}|${r.gap_ms}|${r.overlap_ms}|${r.lag_spike}`) {
      openHandoff(card, g.name, r.id, true);
    }
  });
  setClass(strip, "no-rebalances", !rebalances.length);   // not "empty": that class is the groups' placeholder
}

// The strip's width, as a ResizeObserver last saw it (no layout read per frame); a hidden
// strip (no rebalances yet) is as wide as its card.
const stripWidths = new ResizeObserver((entries) => {
  for (const entry of entries) entry.target.observedWidth = entry.contentRect.width;
});
function stripWidth(strip) {
  if (strip.observedWidth === undefined) {
    stripWidths.observe(strip);
    strip.observedWidth = strip.clientWidth;
  }
  return strip.observedWidth || strip.parentElement.clientWidth;
}

function rebalanceMark() {
  return el("button", { type: "button", class: "rebalance-mark" });
}

function rebalanceCluster(card, members, openIds) {
  const ids = members.map((r) => r.id).join(",");
  const list = el("div", { class: "rebalance-cluster-list", role: "list" }, members.map(() => rebalanceMark()));
  const cluster = el("div", { class: `rebalance-cluster${openIds === ids ? "" : " closed"}`, "data-ids": ids }, null, list);
  const head = el("button", { type: "button", class: "rebalance-cluster-head", "aria-haspopup": "true",
    onclick: () => {
      const closing = !cluster.classList.contains("closed");
      for (const other of card.querySelectorAll(".rebalance-cluster")) other.classList.add("closed");
      cluster.classList.toggle("closed", closing);
      head.setAttribute("aria-expanded", String(!closing));
    } }, String(members.length));
  cluster.prepend(head);
  return cluster;
}

async function openHandoff(card, name, id, refresh = false) {
  const panel = card.querySelector('[data-role="handoff"]');
  const current = openRebalance.get(name);
  if (refresh) {
    if (!current || current.id !== id || current.loading) return;   // closed meanwhile, or already asking
  } else if (current && current.id === id) {
    return closeHandoff(card, name);   // a second click closes
  }
  const entry = { id, stamp: current && current.id === id ? current.stamp : "", loading: true };
  openRebalance.set(name, entry);
  const answer = await request(`/api/groups/${encodeURIComponent(name)}/rebalances/${id}`);
  if (openRebalance.get(name) !== entry) return;
  if (!answer.ok) return handoffError(panel, answer.error);
  const r = answer.data;
  entry.loading = false;
  entry.stamp = `${r.moved}|${r.duplicates}|${r.gap_ms}|${r.overlap_ms}|${r.lag_spike}`;
  panel.replaceChildren(...handoffPanel(card, name, r));
  panel.hidden = false;
  for (const mark of card.querySelectorAll(".rebalance-mark")) setClass(mark, "open", mark.dataset.rebalanceId === String(id));
}

// Under the marks, where the click was (a second click on the mark closes it).
function handoffError(panel, message) {
  panel.replaceChildren(el("p", { class: "control-error", "data-role": "control-error", role: "alert" }, message));
  panel.hidden = false;
}

function closeHandoff(card, name) {
  openRebalance.delete(name);
  const panel = card.querySelector('[data-role="handoff"]');
  panel.hidden = true;
  panel.replaceChildren();
  for (const mark of card.querySelectorAll(".rebalance-mark.open")) mark.classList.remove("open");
}

function handoffPanel(card, name, r) {
  const head = el("p", { class: "handoff-summary", "data-role": "handoff-summary", "data-rebalance-id": String(r.id),
    "data-duplicates": String(r.duplicates), "data-moved": String(r.moved) },
    el("b", {}, `Rebalance at ${clock(r.ts)}`), ` (${r.reason || "rebalance"}): ${plural(r.moved, "queue")} moved, `,
    el("b", {}, duplicatesText(r)),
    ` · gap up to ${fmtMs(r.gap_ms)} · overlap up to ${fmtMs(r.overlap_ms)}`,
    el("button", { type: "button", class: "close", "data-action": "close-handoff", onclick: () => closeHandoff(card, name) }, "Close"));
  const why = el("p", { class: "handoff-why" },
    "Each consumer rebalances on its own. The new owner starts at the committed offset, so what the old owner consumed " +
    "after its last commit is consumed again (RocketMQ's at-least-once). An overlap is when both held the queue; a gap when neither consumed it.");
  const rows = r.moves.map((m) => el("tr", { "data-handoff-queue": m.queue, "data-duplicates": String(m.duplicates) },
    el("td", {}, m.queue), el("td", {}, `${m.from.join(" + ") || "nobody"} → ${m.to || "nobody"}`),
    el("td", {}, m.gap_ms ? fmtMs(m.gap_ms) : "–"),
    el("td", {}, m.overlap_ms ? `${fmtMs(m.overlap_ms)}${m.overlap_ongoing ? " (ongoing)" : ""}` : "–"),
    m.duplicates === null
      ? el("td", { class: "muted", title: "a peer (ali-ons, the C++ client) reports no consumed offsets" }, "not measured")
      : el("td", { class: m.duplicates ? "hot" : "" }, fmt(m.duplicates)),
    el("td", {}, m.lag_spike === null || m.lag_spike === undefined ? "–" : `+${fmt(m.lag_spike)} (${fmt(m.lag_before)} → ${fmt(m.lag_peak)})`)));
  const table = el("table", { class: "handoff-moves" },
    el("thead", {}, el("tr", {}, ["queue", "from → to", "gap", "overlap", "consumed twice", "lag spike"].map((h) => el("th", { scope: "col" }, h)))),
    el("tbody", {}, rows));
  return [head, why, el("div", { class: "handoff-scroll" }, table)];
}
