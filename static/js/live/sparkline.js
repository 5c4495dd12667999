// A line of `values` (nulls break it) in an inline SVG filling `host`; redrawn only when
// the values' length or ends changed.
const SVG = "http://www.w3.org/2000/svg";

export function drawSparkline(host, values, width, height) {
  if (!host) return;
  const key = values ? `${values.length}|${values.at(-1)}|${values[0]}` : "";
  if (host.drawnKey === key) return;
  host.drawnKey = key;
  if (!values || !values.length) return host.replaceChildren();
  const max = Math.max(1, ...values.filter((v) => v !== null));
  const step = values.length > 1 ? width / (values.length - 1) : 0;
  let d = "", pen = false;
  values.forEach((v, i) => {
    if (v === null) { pen = false; return; }
    d += `${pen ? "L" : "M"}${(i * step).toFixed(1)},${(height - 1 - (v / max) * (height - 2)).toFixed(1)}`;
    pen = true;
  });
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  svg.setAttribute("class", "spark");
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", `lag from ${values.find((v) => v !== null) ?? 0} to ${values.at(-1) ?? 0}, peak ${max}`);
  const path = document.createElementNS(SVG, "path");
  path.setAttribute("d", d);
  svg.append(path);
  host.replaceChildren(svg);
}
