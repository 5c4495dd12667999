// What the lag history page says beside its charts (history/marks.js).
import assert from "node:assert/strict";
import { test } from "node:test";
import { BEHIND_MS, faultMark, freshness, markLabels, rebalanceMark } from "../history/marks.js";

const T0 = Date.parse("2026-01-01T10:58:00Z");
const iso = (ms) => new Date(ms).toISOString();

test("close marks share one label, the others keep theirs; the hover lists every one", () => {
  // 12 kills 5 s apart in a 10-minute chart 600 px wide: 5 s is 5 px, all one label.
  const kills = Array.from({ length: 12 }, (_, i) => faultMark({ name: "kill", client_id: `c${i + 4}`, t: iso(T0 + 120_000 + 5_000 * i), detail: {} }, "#c92a2a"));
  const strategy = faultMark({ name: "strategy", t: iso(T0 + 400_000), detail: { strategy: "AVG_BY_CIRCLE" } }, "#7048e8");
  const labels = markLabels([...kills, strategy], T0, T0 + 600_000, 600);
  assert.deepEqual(labels.map((l) => l.text), ["kill c4 +11", "strategy AVG_BY_CIRCLE"]);
  assert.equal(labels[0].hovertext.split("<br>").length, 12);
  assert.equal(labels[0].colour, "#c92a2a");
  // Drawn over 60 000 px, 5 s are 500 px: each its own.
  assert.equal(markLabels(kills, T0, T0 + 600_000, 60_000).length, 12);
});

test("labels stay short: a long client id is cut, the whole is in the hover", () => {
  const r = rebalanceMark({ client_id: "192.0.2.2@ali-ons-13877", end: iso(T0), duration_ms: 1200 });
  assert.equal(r.text, "rebalance …@ali-ons-13877");
  const [label] = markLabels([r, { ...r, ms: r.ms + 1 }], T0, T0 + 600_000, 600);
  assert.ok(label.text.length <= 26 && label.text.endsWith("+1"), label.text);
  assert.match(label.hovertext, /rebalance by 192\.0\.2\.2@ali-ons-13877: 1,200 ms/);
  assert.equal(label.colour, "#555");
});

test("freshness: the backlog is news only when nothing folds it in soon", () => {
  const now = T0;
  const live = freshness({ state: "running", newest_sample_ts: now - 6_000 }, 37, now);
  assert.equal(live.pending, "");
  assert.match(live.service, /^live: new windows every ~10 s/);
  const behind = freshness({ state: "running", newest_sample_ts: now - BEHIND_MS - 60_000 }, 37, now);
  assert.match(behind.service, /^live, but 2 min behind$/);
  assert.match(behind.pending, /^37 recording files not processed yet: the lag service is catching up$/);
  const stopped = freshness({ state: "stopped", paused: null }, 1, now);
  assert.deepEqual(stopped, { service: "", error: false, pending: "1 recording file not processed yet: run the lag job" });
  const paused = freshness({ state: "paused", paused: "Spark failed" }, 0, now);
  assert.equal(paused.service, "history paused: Spark failed");
  assert.ok(paused.error);
});
