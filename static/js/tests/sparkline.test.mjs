// The sparklines' path (live/sparkline.js): heights by scale, gaps at nulls.
import assert from "node:assert/strict";
import { test } from "node:test";
import { sparkPath } from "../live/sparkline.js";

// The y of each point of a path ("M0.0,27.0L...").
const ys = (d) => [...d.matchAll(/[ML][\d.]+,([\d.]+)/g)].map((m) => Number(m[1]));

test("linear: the peak at the top, zero at the bottom, a null breaks the line", () => {
  const { d, max } = sparkPath([0, 50, null, 100], 30, 28);
  assert.equal(max, 100);
  assert.deepEqual(ys(d), [27, 14, 1]);
  assert.equal(d.match(/M/g).length, 2);
});

test("log: a restart's backlog spike leaves the steady sub-second line visible", () => {
  // 25 minutes of time lag at the start (the backlog from before the stop), then ~300 ms.
  const values = [1_500_000, 300, 350, 280, 400];
  const linear = ys(sparkPath(values, 40, 28).d);
  const log = ys(sparkPath(values, 40, 28, "log").d);
  assert.ok(linear.slice(1).every((y) => y > 26.9), "linear: the steady line is on the bottom");
  assert.equal(log[0], 1);
  assert.ok(log.slice(1).every((y) => y > 18 && y < 24), `log: the steady line above the bottom (${log})`);
  assert.ok(log[4] < log[3], "log: 400 ms sits above 280 ms");
});

test("log: a few ms of jitter under a sub-second peak stays small", () => {
  const [, zero, ten, thirty] = ys(sparkPath([434, 0, 10, 30], 30, 28, "log").d);
  assert.equal(zero, 27);
  assert.ok(zero - ten < 3, `10 ms within 3 px of 0 (${ten})`);
  assert.ok(thirty < ten, "30 ms above 10 ms");
});
