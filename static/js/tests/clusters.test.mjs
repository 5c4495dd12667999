// Close things as one (common/clusters.js): the rebalance strip's and the history's marks.
import assert from "node:assert/strict";
import { test } from "node:test";
import { clusterByGap, gapFor } from "../common/clusters.js";

const ids = (clusters) => clusters.map((c) => c.map((r) => r.id));

test("marks closer than the gap are one cluster, the others alone, in time order", () => {
  const marks = [{ id: 3, ts: 30_000 }, { id: 1, ts: 0 }, { id: 2, ts: 4_000 }, { id: 4, ts: 31_000 }, { id: 5, ts: 90_000 }];
  assert.deepEqual(ids(clusterByGap(marks, (m) => m.ts, 5_000)), [[1, 2], [3, 4], [5]]);
});

test("a chain of close marks is one cluster (12 during churn are one, not 12 on top of each other)", () => {
  const churn = Array.from({ length: 12 }, (_, i) => ({ id: i, ts: i * 3_000 }));
  assert.deepEqual(ids(clusterByGap(churn, (m) => m.ts, 5_000)), [churn.map((m) => m.id)]);
});

test("a gap exactly as wide as needed keeps marks apart; nothing in, nothing out", () => {
  assert.deepEqual(ids(clusterByGap([{ id: 1, ts: 0 }, { id: 2, ts: 5_000 }], (m) => m.ts, 5_000)), [[1], [2]]);
  assert.deepEqual(clusterByGap([], (m) => m.ts, 5_000), []);
});

test("the gap follows the drawing: 18 px of a 15 min strip 1500 px wide are 10.8 s", () => {
  assert.equal(gapFor(900_000, 1500, 18), 10_800);
  assert.equal(gapFor(900_000, 0, 18), 900_000);   // not drawn yet: all one
});
