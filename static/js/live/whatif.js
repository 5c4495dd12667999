// What-if: picking another strategy first asks the server what it would do: the
// assignment the members would compute (their own allocate.py, over the live members and
// online queues) and the queues that would move. The panel lists them, the assignment
// view outlines their cells, and only Apply switches. While the group changes underneath,
// the preview is asked again.
import { el } from "../common/dom.js";
import { callApi } from "./actions.js";
import { request } from "./api.js";
import { viewOf } from "./assignment.js";
import { showError } from "./errors.js";
import { lab } from "./model.js";
import { consumersOf, isAlive, queuesOf } from "./queues.js";

const MOVES_LISTED = 12;        // more are outlined in the view, not listed
const NO_MOVES = new Map();
const previews = new Map();     // group name -> {strategy, answer, moves: label -> move, basis, loading}

// The queues the group's preview would move (label -> {queue, from, to}); none without one.
export const movesOf = (name) => previews.get(name)?.moves || NO_MOVES;

// What a preview depends on: when this changes, it is out of date.
const previewBasis = (g) => JSON.stringify([g.strategy, queuesOf(g, lab.topics[g.topic]),
  consumersOf(g).filter((c) => isAlive(g, c)), g.assignments]);

export async function previewStrategy(card, name, strategy) {
  const g = lab.groups[name];
  const select = card.querySelector('[data-control="strategy"]');
  if (!g || strategy === g.strategy) return closePreview(card, name);
  if (g.mode === "pop") {   // pop consumers ignore the strategy: nothing to preview
    return callApi(`/api/groups/${encodeURIComponent(name)}/strategy`, { strategy }, select);
  }
  select.dataset.busy = "1";   // the pick stays while it is previewed (group card's setSelect)
  const entry = { ...(previews.get(name) || {}), strategy, basis: previewBasis(g), loading: true };
  previews.set(name, entry);
  const answer = await request(`/api/groups/${encodeURIComponent(name)}/strategy/preview?strategy=${encodeURIComponent(strategy)}`);
  if (previews.get(name) !== entry) return;   // cancelled, or a newer pick
  if (!answer.ok) {
    showError(answer.error, select);
    return closePreview(card, name);
  }
  Object.assign(entry, { answer: answer.data, moves: new Map(answer.data.moves.map((m) => [m.queue, m])), loading: false });
  showPreview(card, name, entry);
}

// Asked again when what it was computed from changed.
export function refreshPreview(card, g) {
  const entry = previews.get(g.name);
  if (entry && !entry.loading && entry.basis !== previewBasis(g)) previewStrategy(card, g.name, entry.strategy);
}

function showPreview(card, name, entry) {
  const { strategy, answer, moves } = entry;
  const g = lab.groups[name];
  const panel = card.querySelector('[data-role="strategy-preview"]');
  const who = (m) => `${m.queue}: ${m.from.join(" + ") || "nobody"} → ${m.to || "nobody"}`;
  const listed = answer.moves.slice(0, MOVES_LISTED);
  const apply = el("button", { type: "button", "data-action": "apply-strategy" }, `Apply ${strategy}`);
  apply.addEventListener("click", async () => {
    entry.loading = true;   // not asked again while the switch itself changes the group
    const done = await callApi(`/api/groups/${encodeURIComponent(name)}/strategy`, { strategy }, apply);
    entry.loading = false;
    if (done) closePreview(card, name);
  });
  panel.replaceChildren(
    el("p", { "data-role": "preview-summary", "data-moved": String(answer.moved) },
      el("b", {}, `${answer.moved} queue${answer.moved === 1 ? "" : "s"} would move`),
      ` switching ${g ? g.strategy : "?"} → ${strategy}, as the members would compute it now` +
      (answer.moved ? " (outlined below)" : "")),
    listed.length ? el("ul", { class: "moves", "data-role": "preview-moves" }, listed.map((m) => el("li", {}, who(m))),
      answer.moves.length > listed.length ? el("li", { class: "more" }, `… and ${answer.moves.length - listed.length} more`) : null) : null,
    el("div", { class: "preview-actions" }, apply,
      el("button", { type: "button", "data-action": "cancel-strategy", onclick: () => closePreview(card, name) }, "Cancel")));
  panel.hidden = false;
  viewOf(name)?.markMoves(moves);
}

function closePreview(card, name) {
  previews.delete(name);
  const panel = card.querySelector('[data-role="strategy-preview"]');
  panel.hidden = true;
  panel.replaceChildren();
  const select = card.querySelector('[data-control="strategy"]');
  delete select.dataset.busy;
  if (lab.groups[name]) select.value = lab.groups[name].strategy;
  viewOf(name)?.markMoves(NO_MOVES);
}
