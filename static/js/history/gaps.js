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

// A heatmap's columns from the window ends it has (ISO, sorted), with an empty column at each
// edge of a gap: plotly draws each cell out to halfway to its neighbours, so without them the
// windows on either side of a gap would stretch over it, showing a status nobody measured.
// The added columns match no window, so their cells stay empty.
export function heatmapColumns(times, res) {
  const step = RES_MS[res];
  const out = [];
  times.forEach((t, i) => {
    if (i > 0 && step) {
      const prev = Date.parse(times[i - 1]);
      const next = Date.parse(t);
      if (next - prev > step) {
        out.push(new Date(prev + step).toISOString());
        if (next - step > prev + step) out.push(new Date(next - step).toISOString());
      }
    }
    out.push(t);
  });
  return out;
}
