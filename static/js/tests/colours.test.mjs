// A consumer's colour (live/colours.js): given on first sight, kept for the page's life.
import assert from "node:assert/strict";
import { test } from "node:test";
import { ColourBook, PALETTE, slotColour } from "../live/colours.js";

test("the lab's cN gets the palette's Nth when nobody took it", () => {
  const book = new ColourBook();
  assert.equal(book.colourOf("c1"), PALETTE[0]);
  assert.equal(book.colourOf("c3"), PALETTE[2]);
  assert.equal(book.colourOf("c2"), PALETTE[1]);
});

test("a colour is kept whoever comes and goes, and never given to another", () => {
  const book = new ColourBook();
  const first = Object.fromEntries(["c1", "c2", "c3"].map((c) => [c, book.colourOf(c)]));
  const peer = book.colourOf("192.0.2.2@ali-ons-13877");   // a peer joins: the first free colour
  assert.equal(peer, PALETTE[3]);
  assert.notEqual(book.colourOf("c4"), peer);              // c4's own is taken: another one
  for (const c of ["c5", "c6", "c7", "c8"]) book.colourOf(c);
  for (const [cid, colour] of Object.entries(first)) assert.equal(book.colourOf(cid), colour);
  assert.equal(book.colourOf("192.0.2.2@ali-ons-13877"), peer);
  const all = ["c1", "c2", "c3", "c4", "c5", "c6", "c7", "c8", "192.0.2.2@ali-ons-13877"].map((c) => book.colourOf(c));
  assert.equal(new Set(all).size, all.length);
});

test("a view colours the lab's consumers first: a peer sorting before c1 does not take c1's colour", () => {
  const book = new ColourBook();
  book.colourAll(["192.0.2.2@ali-ons-13877", "c1", "c2"]);
  assert.equal(book.colourOf("c1"), PALETTE[0]);
  assert.equal(book.colourOf("c2"), PALETTE[1]);
  assert.equal(book.colourOf("192.0.2.2@ali-ons-13877"), PALETTE[2]);
});

test("past the palette every consumer still gets a colour of its own", () => {
  const book = new ColourBook();
  const colours = Array.from({ length: 128 }, (_, i) => book.colourOf(`c${i + 1}`));
  assert.equal(new Set(colours).size, 128);
  assert.equal(colours[20], slotColour(20));
});
