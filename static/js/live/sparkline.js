// A line of `values` (nulls break it) in an inline SVG filling `host`; redrawn only when
// the values' length or ends changed. The path itself is sparkPath's (pure, unit-tested).
const SVG = "http://www.w3.org/2000/svg";

// How high a value of `max` sits (0..1). "log" is for a time lag (ms): after a restart the
// first samples hold the backlog from before the stop (minutes), and on a linear scale the
// steady sub-second line then lies flat on the bottom for the five minutes those samples stay.
// Logarithmic above ~50 ms, nearly linear below it: a steady line's jitter of a few ms stays
// small instead of swinging across the whole height.
const LOG_UNIT_MS = 50;
const HEIGHTS = {
  linear: (v, max) => v / max,
  log: (v, max) => Math.log1p(Math.max(0, v) / LOG_UNIT_MS) / Math.log1p(max / LOG_UNIT_MS),
};

// The SVG path of `values` in a width x height box (y grows downwards) and the peak it is scaled to.
export function sparkPath(values, width, height, scale = "linear") {
  const max = Math.max(1, ...values.filter((v) => v !== null));
  const at = HEIGHTS[scale];
  const step = values.length > 1 ? width / (values.length - 1) : 0;
  let d = "", pen = false;
  values.forEach((v, i) => {
    if (v === null) { pen = false; return; }
    d += `${pen ? "L" : "M"}${(i * step).toFixed(1)},${(height - 1 - at(v, max) * (height - 2)).toFixed(1)}`;
    pen = true;
  });
  return { d, max };
}

export function drawSparkline(host, values, width, height, scale = "linear") {
  if (!host) return;
  const key = values ? `${values.length}|${values.at(-1)}|${values[0]}` : "";
  if (host.drawnKey === key) return;
  host.drawnKey = key;
  if (!values || !values.length) return host.replaceChildren();
  const { d, max } = sparkPath(values, width, height, scale);
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  svg.setAttribute("class", "spark");
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", `lag from ${values.find((v) => v !== null) ?? 0} to ${values.at(-1) ?? 0}, peak ${max}`
    + (scale === "log" ? " (log scale)" : ""));
  const path = document.createElementNS(SVG, "path");
  path.setAttribute("d", d);
  svg.append(path);
  host.replaceChildren(svg);
}
