// Small pieces that name a consumer or a queue, shared by the matrix, the grid and the card.
import { el } from "../common/dom.js";
import { MIB, fmt, fmtTimeLag, shortCid } from "../common/format.js";

export const noopText = (n) => `${n} no-op rebalance${n === 1 ? "" : "s"}`;

// "slow 200 ms", "fail 20%": the faults a consumer runs with.
export const faultsOf = (c) => [c.slow_ms ? `slow ${c.slow_ms} ms` : "", c.fail_ratio ? `fail ${Math.round(c.fail_ratio * 100)}%` : ""]
  .filter(Boolean);

export { shortCid };

// A long client id (a peer's 192.0.2.2@ali-ons-13877) shortened (format.js shortCid), the
// whole on hover: the matrix stays inside its card.
export function cidLabel(cid) {
  const short = shortCid(cid);
  return el("span", { class: "cid", title: short === cid ? null : cid, "data-cid": cid }, short);
}

// One queue in words, for the grid's tooltip.
export function queueDetails(g, label, facts, totals) {
  const q = g.queues[label] || {};
  const who = g.mode === "pop" ? `received by ${facts.owners.join(", ") || "nobody recently"}`
    : facts.state === "owned" ? `owned by ${facts.owner}`
      : facts.state === "contested" ? `${facts.owners.length} owners: ${facts.owners.join(", ")}` : "unowned";
  return [label, who, `lag ${fmt(q.lag)} · time lag ${fmtTimeLag(q.time_lag_ms)}`,
    `cached ${fmt(totals.cached_count)} msgs · ${fmt(totals.cached_bytes / MIB, 1)} MiB · span ${fmt(totals.span)}`];
}
