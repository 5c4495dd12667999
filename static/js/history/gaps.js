// Breaks in the history's lines where nothing was recorded (the lab stopped, a queue was
// gone): plotly joins the points on either side of a gap unless a null lies between them,
// and a line drawn across an hour without recordings shows lag nobody measured.

export const RES_MS = { "10s": 10_000, "1m": 60_000 };

// `series`: { t: [ISO window ends], <column>: [values], ... } at `res` ("10s" | "1m").
// Returns the same columns with one null point (at the missing window's end) wherever the
// next window is more than one window later: plotly leaves the line open there.
export function withGaps(series, res) {
  const step = RES_MS[res];
  const columns = Object.keys(series).filter((k) => k !== "t" && Array.isArray(series[k]));
  const out = { ...series, t: [] };
  columns.forEach((k) => { out[k] = []; });
  series.t.forEach((t, i) => {
    if (i > 0 && step) {
      const prev = Date.parse(series.t[i - 1]);
      if (Date.parse(t) - prev > step) {
        out.t.push(new Date(prev + step).toISOString());
        columns.forEach((k) => out[k].push(null));
      }
    }
    out.t.push(t);
    columns.forEach((k) => out[k].push(series[k][i]));
  });
  return out;
}

// The spans nothing was recorded in, from a series' window ends at `res`: from the end of
// the last window before a gap to the start of the first after it ({ from, to }, ISO).
// The charts shade them (an open line alone can read as a line at 0: the axis's zero line
// runs on through the gap).
export function gapSpans(series, res) {
  const step = RES_MS[res];
  const spans = [];
  if (!step) return spans;
  for (let i = 1; i < series.t.length; i += 1) {
    const prev = Date.parse(series.t[i - 1]);
    const next = Date.parse(series.t[i]);
    if (next - prev > step) {
      spans.push({ from: new Date(prev).toISOString(), to: new Date(next - step).toISOString() });
    }
  }
  return spans;
}

// A heatmap's bricks from the window ends it has (ISO, sorted): `columns` (a window's end, or
// null for a span with no windows) and their `edges` (one more: plotly then draws each brick
// exactly from its edge to the next, where from cell centres it stretches every cell halfway
// to its neighbour - over a gap, a status nobody measured).
export function heatmapBricks(times, res) {
  const step = RES_MS[res];
  if (!step || !times.length) return { columns: [...times], edges: [] };
  const columns = [];
  const edges = [new Date(Date.parse(times[0]) - step).toISOString()];
  times.forEach((t, i) => {
    const end = Date.parse(t);
    if (i > 0 && end - Date.parse(times[i - 1]) > step) {
      columns.push(null);
      edges.push(new Date(end - step).toISOString());
    }
    columns.push(t);
    edges.push(t);
  });
  return { columns, edges };
}
