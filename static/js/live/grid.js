// Large groups: one small cell per queue, grouped by broker, filled in its owner's colour;
// two owners striped and outlined red, none hatched grey (lab.css). A legend names each
// consumer: hovering or focusing one highlights its queues, a click keeps the highlight.
// Hovering a cell shows its figures in a tooltip.
import { el, setAttr, setClass, setData, setMark, setStyle, setText } from "../common/dom.js";
import { colourOf } from "./colours.js";
import { cidLabel, faultsOf, noopText, queueDetails } from "./labels.js";
import { isAlive, isHot, pqTotals, queueFacts, splitLabel } from "./queues.js";
import { drawSparkline } from "./sparkline.js";

// A cell's fill: its owner's colour; several owners (or pop receivers) striped.
function fillOf(owners) {
  if (!owners.length) return "";
  if (owners.length === 1) return `background:${colourOf(owners[0])}`;
  const stripes = owners.slice(0, 4).map((cid, i) => `${colourOf(cid)} ${i * 3}px ${(i + 1) * 3}px`);
  return `background:repeating-linear-gradient(135deg,${stripes.join(",")})`;
}

export class GridView {
  constructor(name) {
    this.summary = el("span", { class: "grid-summary", "data-role": "summary" });
    const sample = (state, text, extra = "") => el("span", { class: "key" }, el("span", { class: `qcell ${extra}`, "data-state": state }), text);
    const key = el("span", { class: "grid-key" }, sample("contested", "2+ owners"), sample("unowned", "unowned"),
      sample("owned", "over a flow-control threshold", "hot"), "· hover a cell for its figures");
    this.legend = el("div", { class: "legend", role: "group", "aria-label": "consumers: hover or click one to highlight its queues" });
    this.blocks = el("div", { class: "broker-blocks" });
    this.tip = el("div", { class: "qtip", role: "tooltip", hidden: true });
    this.root = el("div", { class: "assign-grid", "data-assignment-group": name },
      el("div", { class: "grid-head" }, this.summary, key), this.legend, this.blocks, this.tip);
    this.cells = new Map();     // label -> cell
    this.brokers = new Map();   // broker -> {section, name, grid}
    this.entries = new Map();   // client id -> legend entry
    this.queuesKey = null;
    this.consumersKey = null;
    this.hovered = null;        // the legend entry under the pointer (or focused)
    this.pinned = null;         // the legend entry clicked
    this.tipLabel = null;       // the queue the tooltip describes
    this.listen();
  }

  get focus() { return this.hovered || this.pinned; }

  listen() {
    const consumerOf = (event) => event.target.closest(".legend-item")?.dataset.consumer;
    const preview = (cid) => { this.hovered = cid; this.applyFocus(); };
    this.legend.addEventListener("mouseover", (event) => { const cid = consumerOf(event); if (cid) preview(cid); });
    this.legend.addEventListener("focusin", (event) => preview(consumerOf(event) || null));
    this.legend.addEventListener("mouseleave", () => preview(null));
    this.legend.addEventListener("focusout", () => preview(null));
    this.legend.addEventListener("click", (event) => {
      const cid = consumerOf(event);
      if (!cid) return;
      this.pinned = this.pinned === cid ? null : cid;
      this.applyFocus();
    });
    this.blocks.addEventListener("mouseover", (event) => {
      const cell = event.target.closest("[data-queue]");
      if (cell) this.showTip(cell);
    });
    this.blocks.addEventListener("mouseleave", () => this.hideTip());
  }

  // `holders`: label -> client ids claiming it (queues.js ownerIndex); `series`: the group's lag series.
  update(g, queues, consumers, holders, series) {
    this.g = g;
    this.holders = holders;
    this.series = series;
    this.syncCells(queues);
    const held = new Map();   // client id -> how many queues it holds (pop: received from)
    const issues = { contested: 0, unowned: 0 };
    for (const label of queues) {
      const facts = queueFacts(g, label, holders.get(label));
      for (const cid of facts.owners) held.set(cid, (held.get(cid) || 0) + 1);
      if (facts.state in issues) issues[facts.state] += 1;
      this.paint(this.cells.get(label), facts, isHot(pqTotals(g, label, holders.get(label))));
    }
    this.syncLegend(g, consumers, held);
    const alive = consumers.filter((c) => isAlive(g, c)).length;
    setText(this.summary, g.mode === "pop"
      ? `${queues.length} queues · ${alive} consumers · pop: each queue is shared, a cell shows who received its messages lately`
      : `${queues.length} queues · ${alive} consumers · ${issues.contested} with 2+ owners · ${issues.unowned} unowned`);
    setClass(this.summary, "issues", issues.contested + issues.unowned > 0);
    if (this.tipLabel) this.fillTip();
  }

  // Cells are made once per queue and kept; only a change of the topic's queues adds,
  // removes or moves them.
  syncCells(queues) {
    const key = queues.join(" ");
    if (key === this.queuesKey) return;
    this.queuesKey = key;
    const wanted = new Set(queues);
    for (const [label, cell] of this.cells) {
      if (!wanted.has(label)) {
        cell.remove();
        this.cells.delete(label);
      }
    }
    const byBroker = new Map();
    for (const label of queues) {
      const broker = splitLabel(label)[0];
      if (!byBroker.has(broker)) byBroker.set(broker, []);
      if (!this.cells.has(label)) this.cells.set(label, el("span", { class: "qcell", "data-queue": label }));
      byBroker.get(broker).push(this.cells.get(label));
    }
    for (const [broker, block] of this.brokers) {
      if (!byBroker.has(broker)) {
        block.section.remove();
        this.brokers.delete(broker);
      }
    }
    for (const [broker, cells] of byBroker) {
      if (!this.brokers.has(broker)) {
        const name = el("h3", { class: "broker-name" }), grid = el("div", { class: "cells" });
        this.brokers.set(broker, { section: el("section", { class: "broker-block", "data-broker": broker }, name, grid), name, grid });
      }
      const block = this.brokers.get(broker);
      setText(block.name, `${broker} (${cells.length})`);
      block.grid.append(...cells);           // moves kept cells into order, adds new ones
      this.blocks.append(block.section);     // brokers in order too
    }
    setClass(this.root, "many", queues.length > 512);   // smaller cells (lab.css)
  }

  paint(cell, facts, hot) {
    const owners = facts.owners.join(",");
    const moved = cell.dataset.owners !== owners;
    setData(cell, "owners", owners);
    setData(cell, "owner", facts.owner);
    setData(cell, "state", facts.state);
    setStyle(cell, fillOf(facts.owners));
    setClass(cell, "hot", hot);
    if (moved) this.highlight(cell);
  }

  // What-if: outline the queues that would move.
  markMoves(moves) {
    this.marked = moves.size > 0;
    for (const [label, cell] of this.cells) setMark(cell, moves.has(label));
  }

  syncLegend(g, consumers, held) {
    const key = consumers.join(" ");
    if (key !== this.consumersKey) {
      this.consumersKey = key;
      const wanted = new Set(consumers);
      for (const [cid, entry] of this.entries) {
        if (!wanted.has(cid)) {
          entry.remove();
          this.entries.delete(cid);
        }
      }
      for (const cid of consumers) {
        if (!this.entries.has(cid)) this.entries.set(cid, el("button", { type: "button", class: "legend-item", "data-consumer": cid, "aria-pressed": "false" }));
      }
      this.legend.append(...consumers.map((cid) => this.entries.get(cid)));
    }
    for (const cid of consumers) {
      const c = g.clients[cid] || {};
      const status = c.status || "running";
      const count = held.get(cid) || 0;
      const entry = this.entries.get(cid);
      setData(entry, "status", status);
      setClass(entry, "dead", !isAlive(g, cid));
      const noops = g.noopRebalances[cid] || 0;
      const look = `${status}|${count}|${c.slow_ms || 0}|${c.fail_ratio || 0}|${noops}`;
      if (entry.shownLook === look) continue;
      entry.shownLook = look;
      entry.title = [`${cid}: ${status}`, `${count} queue(s)`, noopText(noops), ...faultsOf(c), c.client && c.client !== "ours" ? c.client : ""]
        .filter(Boolean).join(" · ");
      entry.replaceChildren(el("span", { class: "swatch", style: `background:${colourOf(cid)}` }), cidLabel(cid),
        el("span", { class: "count" }, String(count)), ...(status !== "running" ? [el("span", { class: `status ${status}` }, status)] : []));
    }
  }

  applyFocus() {
    const focus = this.focus;
    setClass(this.root, "focusing", Boolean(focus));
    for (const [cid, entry] of this.entries) {
      setClass(entry, "focused", cid === focus);
      setAttr(entry, "aria-pressed", String(cid === this.pinned));
    }
    for (const cell of this.cells.values()) this.highlight(cell);
  }

  highlight(cell) {
    const focus = this.focus;
    setClass(cell, "highlight", Boolean(focus) && cell.dataset.owners.split(",").includes(focus));
  }

  showTip(cell) {
    this.tipLabel = cell.dataset.queue;
    this.fillTip();
    this.tip.hidden = false;
    // Below the cell, or above it near the window's bottom; never past the right edge.
    const box = cell.getBoundingClientRect();
    const below = box.bottom + 6 + this.tip.offsetHeight < innerHeight;
    this.tip.style.left = `${Math.max(4, Math.min(box.left, innerWidth - this.tip.offsetWidth - 4))}px`;
    this.tip.style.top = `${below ? box.bottom + 6 : box.top - 6 - this.tip.offsetHeight}px`;
  }

  hideTip() {
    this.tipLabel = null;
    this.tip.hidden = true;
  }

  fillTip() {
    const label = this.tipLabel;
    if (!this.cells.has(label)) return this.hideTip();
    const held = this.holders.get(label);
    const lines = queueDetails(this.g, label, queueFacts(this.g, label, held), pqTotals(this.g, label, held));
    const series = this.series;
    const key = `${lines.join("\n")}|${series ? series.version : 0}`;
    if (this.tip.dataset.text === key) return;
    this.tip.dataset.text = key;
    const trend = el("div", { class: "tip-trend" });
    drawSparkline(trend, series?.queues.get(label), 180, 32);
    this.tip.replaceChildren(...lines.map((line, i) => el(i ? "div" : "b", {}, line)), el("div", { class: "muted" }, "lag, last 5 min"), trend);
  }
}
