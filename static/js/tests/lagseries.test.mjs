// The last 5 minutes of lag per group (live/lagseries.js).
import assert from "node:assert/strict";
import { test } from "node:test";
import { SERIES_MS, appendLag, emptySeries, mergeLoaded } from "../live/lagseries.js";

const NOW = 1_700_000_000_000;

test("each snapshot adds a sample; a queue that comes later is null before it", () => {
  const s = emptySeries();
  appendLag(s, { queues: { "a:0": { lag: 1, time_lag_ms: 5 } } }, NOW);
  appendLag(s, { queues: { "a:0": { lag: 2, time_lag_ms: null }, "a:1": { lag: 3 } } }, NOW + 1000);
  assert.deepEqual(s.total, [1, 5]);
  assert.deepEqual(s.time, [5, null]);
  assert.deepEqual(s.queues.get("a:1"), [null, 3]);
  assert.equal(s.version, 2);
});

test("samples older than 5 minutes leave, and queues with nothing left go", () => {
  const s = emptySeries();
  appendLag(s, { queues: { "a:0": { lag: 1 } } }, NOW);
  appendLag(s, { queues: { "a:1": { lag: 1 } } }, NOW + SERIES_MS + 1);
  assert.deepEqual(s.ts, [NOW + SERIES_MS + 1]);
  assert.deepEqual([...s.queues.keys()], ["a:1"]);
});

test("the controller's kept minutes go before what the snapshots added meanwhile", () => {
  const mine = emptySeries();
  appendLag(mine, { queues: { "a:0": { lag: 7 } } }, NOW);
  const loaded = { ts: [NOW - 2000, NOW - 1000, NOW], total_lag: [1, 2, 3], time_lag_ms: [0, 0, 0],
    queues: { "a:0": [1, 2, 3], "b:0": [0, 0, 0] } };
  const merged = mergeLoaded(mine, loaded);
  assert.deepEqual(merged.ts, [NOW - 2000, NOW - 1000, NOW]);
  assert.deepEqual(merged.total, [1, 2, 7]);
  assert.deepEqual(merged.queues.get("a:0"), [1, 2, 7]);
  assert.deepEqual(merged.queues.get("b:0"), [0, 0, null]);
  assert.equal(merged.version, 2);
});
