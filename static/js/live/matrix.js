// Small groups: consumers × queues, a cell filled in its consumer's colour when that
// consumer claims the queue (push, lite-pull) or recently received from it (pop), and
// each queue's figures below. The table is built once per (mode, queues, consumers) and
// updated in place; its queue heads are the [data-queue] elements.
import { el, setAttr, setClass, setClassName, setData, setMark, setStyle, setText } from "../common/dom.js";
import { MIB, fmt, fmtTimeLag } from "../common/format.js";
import { colourOf } from "./colours.js";
import { cidLabel, faultsOf, noopText, shortCid } from "./labels.js";
import { POP_WINDOW, THRESHOLDS, isAlive, popsOf, pqTotals, queueFacts, splitLabel } from "./queues.js";
import { drawSparkline } from "./sparkline.js";

// The figure rows: title, then (totals, broker figures) -> [text, over a threshold].
const METRICS = [
  ["cached msgs", (t) => [fmt(t.cached_count), t.cached_count >= THRESHOLDS.cached_count]],
  ["cached MiB", (t) => [fmt(t.cached_bytes / MIB, 1), t.cached_bytes / MIB >= THRESHOLDS.cached_mib]],
  ["span", (t) => [fmt(t.span), t.span >= THRESHOLDS.span]],
  ["lag", (t, q) => [q ? fmt(q.lag) : "–", false]],
  ["time lag", (t, q) => [q ? fmtTimeLag(q.time_lag_ms) : "–", false]],
];
const TREND = "lag, 5 min";

// A consumer's row head: swatch, id, status, faults, which client it is.
function consumerLabel(cid, c, status) {
  const faults = faultsOf(c).join(" · ");
  return [
    el("span", { class: "swatch", style: `background:${colourOf(cid)}` }), cidLabel(cid),
    status !== "running" ? el("span", { class: `status ${status}` }, status) : null,
    c.client === "outside" ? el("span", { class: "peer", "data-role": "outside-client",
      title: c.assignment_source === "unknown" ? `${c.note}: its queues are unknown; lag comes from the broker's stats`
        : "its queues are what it reports holding (GET_CONSUMER_RUNNING_INFO)" },
      `${c.language || "?"} ${c.version || ""}`.trim() + (c.assignment_source === "unknown" ? " · no running info" : ""))
    : c.client && c.client !== "ours" ? el("span", { class: "peer", "data-role": "peer-client",
      title: c.assignment_source === "broker" ? `${c.client}: its queues are what the broker sees it pull`
        : `${c.client}: its queues are what it reports holding (GET_CONSUMER_RUNNING_INFO)` },
      c.assignment_source === "broker" ? `${c.client} · by broker` : c.client) : null,
    faults ? el("span", { class: "faults" }, faults) : null,
  ].filter(Boolean);
}

export class MatrixView {
  constructor(name) {
    this.root = el("table", { class: "matrix", "data-assignment-group": name });
    this.shape = "";
  }

  // `holders`: label -> client ids claiming it (queues.js ownerIndex); `series`: the group's lag series.
  update(g, queues, consumers, holders, series) {
    const pop = g.mode === "pop";
    const shape = [g.mode, queues.join(" "), consumers.join(" ")].join("|");
    if (shape !== this.shape) {
      this.shape = shape;
      this.build(pop, queues, consumers);
    }
    for (const cid of consumers) this.paintConsumer(g, cid);
    for (const label of queues) {
      const held = holders.get(label);
      this.paintHead(this.heads.get(label), label, queueFacts(g, label, held), pop);
      for (const cid of consumers) this.paintCell(this.cells.get(cid).get(label), g, label, cid, held);
      const totals = pqTotals(g, label, held);
      for (const [title, figure] of METRICS) {
        const [text, hot] = figure(totals, g.queues[label]);
        const td = this.figures.get(title).get(label);
        setText(td, text);
        setClass(td, "hot", hot);
      }
      drawSparkline(this.figures.get(TREND).get(label), series?.queues.get(label), 64, 18);
    }
  }

  build(pop, queues, consumers) {
    this.heads = new Map();     // label -> th.queue-head
    this.rows = new Map();      // client id -> tr
    this.cells = new Map();     // client id -> label -> td.cell
    this.figures = new Map();   // metric title -> label -> td
    // Two header rows: each broker over its queues, then each queue by its id alone, so a
    // column is as narrow as its figures (the whole label is the head's title).
    const brokers = [];
    for (const label of queues) {
      const [broker] = splitLabel(label);
      if (brokers.at(-1)?.name === broker) brokers.at(-1).count += 1;
      else brokers.push({ name: broker, count: 1 });
    }
    const brokerRow = el("tr", { class: "broker-row" },
      el("th", { class: "corner", rowspan: 2 }, pop ? "received by" : "owned by"),
      brokers.map((b) => el("th", { class: "broker-head", scope: "colgroup", colspan: b.count, title: b.name }, b.name)));
    const head = el("tr", {}, queues.map((label) => {
      const th = el("th", { class: "queue-head", scope: "col", "data-queue": label },
        el("span", { class: "qlabel" }, String(splitLabel(label)[1])),
        el("span", { class: "qnote" }));
      this.heads.set(label, th);
      return th;
    }));
    const rows = consumers.map((cid) => {
      const cells = new Map(queues.map((label) => [label, el("td", { class: "cell", "data-cell-queue": label, "data-consumer": cid })]));
      const tr = el("tr", { "data-consumer": cid }, el("th", { scope: "row", class: "consumer", title: cid }), [...cells.values()]);
      this.rows.set(cid, tr);
      this.cells.set(cid, cells);
      return tr;
    });
    const foot = [...METRICS.map(([title]) => title), TREND].map((title) => {
      const tds = new Map(queues.map((label) => [label, el("td", { "data-cell-queue": label })]));
      this.figures.set(title, tds);
      return el("tr", { class: title === TREND ? "metric trend" : "metric" }, el("th", { scope: "row" }, title), [...tds.values()]);
    });
    this.root.className = `matrix${pop ? " pop" : ""}`;
    this.root.replaceChildren(el("thead", {}, brokerRow, head), el("tbody", {}, rows), el("tfoot", {}, foot));
  }

  paintHead(th, label, facts, pop) {
    const { owners, state, owner } = facts;
    // Short ids (the whole in the title); lab.css keeps the note as narrow as the queue's label.
    const note = pop ? (owners.length > 1 ? `${owners.length} consumers` : owners.length ? shortCid(owners[0]) : "no pops")
      : state === "owned" ? shortCid(owner) : state === "contested" ? `${owners.length} owners` : "unowned";
    setClassName(th, `queue-head ${state}`);
    setData(th, "state", state);
    setData(th, "owner", owner);
    setData(th, "owners", owners.join(","));
    setAttr(th, "title", pop ? `recent messages of ${label} went to ${owners.join(", ") || "nobody yet"}` : `${label}: ${owners.join(", ") || "no owner"}`);
    setText(th.lastChild, note);
    // The owner's colour under the label, as in the dense grid.
    setStyle(th, state === "owned" ? `box-shadow: inset 0 -3px ${colourOf(owner)}` : "");
  }

  paintConsumer(g, cid) {
    const c = g.clients[cid] || {};
    const status = c.status || "running";
    const tr = this.rows.get(cid);
    setData(tr, "status", status);
    setClass(tr, "dead", !isAlive(g, cid));
    const noops = g.noopRebalances[cid] || 0;
    const look = JSON.stringify([status, c.slow_ms, c.fail_ratio, c.client, c.assignment_source, c.language, c.version, c.note, noops]);
    const th = tr.firstChild;
    if (th.shownLook !== look) {
      th.shownLook = look;
      th.title = `${cid}: ${noopText(noops)}`;
      th.replaceChildren(el("div", { class: "who" }, consumerLabel(cid, c, status)));
    }
  }

  // What-if: a queue that would move, and its cells of the consumers it would leave or join.
  markMoves(moves) {
    this.marked = moves.size > 0;
    for (const [label, th] of this.heads) {
      const move = moves.get(label);
      setMark(th, Boolean(move));
      for (const [cid, cells] of this.cells) setMark(cells.get(label), Boolean(move) && (move.to === cid || move.from.includes(cid)));
    }
  }

  paintCell(td, g, label, cid, held) {
    if (g.mode === "pop") {
      const n = popsOf(g, label).filter((x) => x === cid).length;
      setData(td, "received", String(n));
      setStyle(td, n ? `background:${colourOf(cid)};opacity:${(0.25 + 0.75 * (n / POP_WINDOW)).toFixed(2)}` : "");
      setText(td, n ? String(n) : "");
      return;
    }
    const owns = held.includes(cid);
    setClassName(td, owns ? "cell owns" : "cell");
    setStyle(td, owns ? `background:${colourOf(cid)}` : "");
  }
}
