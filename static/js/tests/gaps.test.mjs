// Lines of the history charts stay open across a gap in the recordings (history/gaps.js).
import assert from "node:assert/strict";
import { test } from "node:test";
import { gapSpans, heatmapBricks, withGaps } from "../history/gaps.js";

const iso = (s) => new Date(Date.parse("2026-01-01T10:00:00Z") + s * 1000).toISOString();

test("a missing window puts a null between the points on either side of it", () => {
  const series = { t: [iso(10), iso(20), iso(3600), iso(3610)], lag: [1, 2, 3, 4], owner: ["a", "a", "b", "b"] };
  const out = withGaps(series, "10s");
  assert.deepEqual(out.lag, [1, 2, null, 3, 4]);
  assert.deepEqual(out.owner, ["a", "a", null, "b", "b"]);
  assert.deepEqual(out.t, [iso(10), iso(20), iso(30), iso(3600), iso(3610)]);
});

test("consecutive windows are left as they are, at either resolution", () => {
  const tenS = { t: [iso(10), iso(20), iso(30)], lag: [1, 2, 3] };
  assert.deepEqual(withGaps(tenS, "10s"), tenS);
  const minutes = { t: [iso(60), iso(120)], lag: [5, 6] };
  assert.deepEqual(withGaps(minutes, "1m"), minutes);
  // 10-s windows 60 s apart are a gap; at 1 m they are neighbours.
  assert.deepEqual(withGaps(minutes, "10s").lag, [5, null, 6]);
});

test("no points, no gaps", () => {
  assert.deepEqual(withGaps({ t: [], lag: [] }, "10s"), { t: [], lag: [] });
});

test("a gap's span runs from the end of the window before it to the start of the one after", () => {
  const series = { t: [iso(10), iso(20), iso(3600), iso(3610)], lag: [1, 2, 3, 4] };
  assert.deepEqual(gapSpans(series, "10s"), [{ from: iso(20), to: iso(3590) }]);
  assert.deepEqual(gapSpans({ t: [iso(10), iso(20), iso(30)], lag: [1, 2, 3] }, "10s"), []);
  assert.deepEqual(gapSpans({ t: [iso(60), iso(120)], lag: [5, 6] }, "1m"), []);
});

test("a heatmap's bricks run from window start to end, a gap one empty brick", () => {
  const { columns, edges } = heatmapBricks([iso(10), iso(20), iso(3600), iso(3610)], "10s");
  assert.deepEqual(columns, [iso(10), iso(20), null, iso(3600), iso(3610)]);
  assert.deepEqual(edges, [iso(0), iso(10), iso(20), iso(3590), iso(3600), iso(3610)]);
  assert.deepEqual(heatmapBricks([iso(60), iso(120)], "1m"), { columns: [iso(60), iso(120)], edges: [iso(0), iso(60), iso(120)] });
  assert.deepEqual(heatmapBricks([], "10s"), { columns: [], edges: [] });
});
