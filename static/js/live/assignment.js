// Each group card holds one assignment view: the element [data-assignment-group=G] with
// one [data-queue] element per queue carrying data-owners and data-state. Views are keyed
// DOM: a queue's elements are built once and afterwards only the attributes that changed
// are written, so a frame costs what changed, not the size of the group.
import { colourAll } from "./colours.js";
import { GridView } from "./grid.js";
import { MatrixView } from "./matrix.js";
import { consumersOf, ownerIndex } from "./queues.js";

// Up to this size the detailed matrix (a row per consumer, figures per queue) stays
// readable; above it each queue is one small cell of a dense grid.
const MATRIX_MAX_QUEUES = 16, MATRIX_MAX_CONSUMERS = 12;

const views = new Map();     // group name -> its assignment view (MatrixView | GridView)

export const viewOf = (name) => views.get(name);
export const dropView = (name) => views.delete(name);

// `queues`: the group's queue labels in order; `moves`: the what-if's queues that would move (label -> move).
export function updateAssignmentView(card, g, queues, series, moves) {
  const consumers = consumersOf(g);
  colourAll(consumers);   // first sight of a consumer gives it its colour for the page's life
  const Kind = queues.length > MATRIX_MAX_QUEUES || consumers.length > MATRIX_MAX_CONSUMERS ? GridView : MatrixView;
  let view = views.get(g.name);
  if (!(view instanceof Kind)) {
    view = new Kind(g.name);
    views.set(g.name, view);
    card.querySelector(".matrix-wrap").replaceChildren(view.root);
  }
  view.update(g, queues, consumers, ownerIndex(g, queues), series);
  if (moves.size || view.marked) view.markMoves(moves);   // nothing to write without a preview
}
