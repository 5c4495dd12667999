// A consumer's colour follows from its id alone, so it keeps it for its life whoever comes
// and goes (and after a reload): the lab's cN is the palette's Nth; past the palette, and
// for other clients' ids (a hash), hues spread by the golden angle (two lightnesses), so
// that 64 or 128 consumers still get colours of their own rather than the palette's again.
const PALETTE = ["#2f6fdf", "#e8871e", "#2ba36b", "#9b4dca", "#d6457a", "#1aa3b5",
                 "#8c6d31", "#5c6bc0", "#7cb342", "#ef6c00", "#00897b", "#6d4c41"];
const colours = new Map();

function colourNumber(clientId) {
  const lab = /^c(\d+)$/.exec(clientId);
  if (lab) return Number(lab[1]) - 1;
  let hash = 0;
  for (const ch of clientId) hash = (hash * 31 + ch.codePointAt(0)) >>> 0;
  return PALETTE.length + (hash % 4093);
}

export function colourOf(clientId) {
  if (!colours.has(clientId)) {
    const n = colourNumber(String(clientId));
    colours.set(clientId, n < PALETTE.length ? PALETTE[n]
      : `hsl(${Math.round((n * 137.508) % 360)} ${n % 2 ? 55 : 70}% ${n % 3 ? 45 : 60}%)`);
  }
  return colours.get(clientId);
}
