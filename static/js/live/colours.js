// A consumer's colour is given on first sight and kept for the page's life, whoever comes
// and goes later: a colour is never taken back, nor given to anyone else, so a killed
// consumer still struck through in its group keeps its own too.
//
// Which colour: the lab's cN asks for the palette's Nth (the same colour after a reload,
// as long as nobody else took it first); anyone else (a peer's 192.0.2.2@ali-ons-13877, a
// cN whose colour is taken) gets the first free one; a view colours the lab's cN first
// (colourAll). Past the palette, hues spread by the
// golden angle (three lightnesses, two saturations), so 64 or 128 consumers still get
// colours of their own. Pure (no DOM): unit-tested in tests/colours.test.mjs.
export const PALETTE = ["#2f6fdf", "#e8871e", "#2ba36b", "#9b4dca", "#d6457a", "#1aa3b5",
                        "#8c6d31", "#5c6bc0", "#7cb342", "#ef6c00", "#00897b", "#6d4c41"];

// The colour of slot n: the palette's, then golden-angle hues.
export function slotColour(n) {
  if (n < PALETTE.length) return PALETTE[n];
  return `hsl(${Math.round((n * 137.508) % 360)} ${n % 2 ? 55 : 70}% ${n % 3 ? 45 : 60}%)`;
}

// The slot a client id would like: cN's is N-1; other ids have none.
const wantedSlot = (clientId) => {
  const lab = /^c(\d+)$/.exec(clientId);
  return lab ? Number(lab[1]) - 1 : null;
};

export class ColourBook {
  constructor() {
    this.slots = new Map();   // client id -> its slot, for the book's life
    this.taken = new Set();   // slots given out
    this.nextFree = 0;        // no free slot below this one
  }

  colourOf(clientId) {
    const id = String(clientId);
    if (!this.slots.has(id)) this.slots.set(id, this.take(wantedSlot(id)));
    return slotColour(this.slots.get(id));
  }

  // Colours for a view's consumers, the lab's cN first: a peer listed before c1
  // (192.0.2.2@... sorts first) must not take c1's colour on a reload.
  colourAll(clientIds) {
    const ids = clientIds.map(String);
    for (const id of ids) if (wantedSlot(id) !== null) this.colourOf(id);
    for (const id of ids) this.colourOf(id);
  }

  take(wanted) {
    let slot = wanted;
    if (slot === null || this.taken.has(slot)) {
      while (this.taken.has(this.nextFree)) this.nextFree += 1;
      slot = this.nextFree;
    }
    this.taken.add(slot);
    return slot;
  }
}

// The page's one book: every view (matrix, grid, legend, charts) colours from it.
const book = new ColourBook();
export const colourOf = (clientId) => book.colourOf(clientId);
export const colourAll = (clientIds) => book.colourAll(clientIds);
