// The shared format helpers (common/format.js): what figures, durations and times read as.
import assert from "node:assert/strict";
import { test } from "node:test";
import { clock, fmt, fmtMs, fmtTimeLag, javaOrder, plural, shortCid, shortName } from "../common/format.js";

test("fmt: thousands separators, digits on request, a dash for nothing", () => {
  assert.equal(fmt(1234567), "1,234,567");
  assert.equal(fmt(1.26, 1), "1.3");
  assert.equal(fmt(0), "0");
  assert.equal(fmt(null), "–");
  assert.equal(fmt(undefined), "–");
});

test("fmtMs: ms below a second, seconds below two minutes, minutes after", () => {
  assert.equal(fmtMs(340.4), "340 ms");
  assert.equal(fmtMs(1500), "1.5 s");
  assert.equal(fmtMs(119999), "120.0 s");
  assert.equal(fmtMs(180000), "3 min");
  assert.equal(fmtMs(null), "–");
});

test("fmtTimeLag: an unknown time lag never reads as caught up", () => {
  assert.equal(fmtTimeLag(null), "unknown");
  assert.equal(fmtTimeLag(0), "0 ms");
});

test("plural and javaOrder", () => {
  assert.equal(plural(1, "queue"), "1 queue");
  assert.equal(plural(2000, "message"), "2,000 messages");
  // Java compares UTF-16 code units: upper case before lower case, "c10" before "c2".
  assert.deepEqual(["c2", "c10", "B", "a"].sort(javaOrder), ["B", "a", "c10", "c2"]);
});

test("clock: 24-hour wall time, the same text for the same instant", () => {
  const ts = Date.UTC(2024, 0, 1, 13, 5, 9);
  assert.match(clock(ts), /^\d\d:05:09$/);
  assert.equal(clock(ts), clock(ts));
});

test("a long name is cut in the middle, its ends kept, never longer than asked", () => {
  assert.equal(shortName("broker-a:0", 16), "broker-a:0");
  const cut = shortName("TopicWithAVeryLongName@broker-b:3", 16);
  assert.equal(cut.length, 16);
  assert.ok(cut.startsWith("Topic") && cut.endsWith("-b:3") && cut.includes("…"), cut);
  // A client id keeps its instance (what tells two clients of one machine apart).
  assert.equal(shortCid("192.0.2.2@ali-ons-13877"), "…@ali-ons-13877");
  assert.equal(shortCid("c12"), "c12");
  const long = shortCid("10.0.0.1@a-very-long-instance-name-12345");
  assert.ok(long.length <= 16 && long.endsWith("12345"), long);
});
