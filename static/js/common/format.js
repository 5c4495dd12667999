// How numbers, durations and times read on every page (pure: no DOM).

export const MIB = 1024 * 1024;

// JS compares strings by UTF-16 code units, as Java does: client ids and brokers sort as RocketMQ sorts them.
export const javaOrder = (a, b) => (a < b ? -1 : a > b ? 1 : 0);

// A figure with thousands separators; "–" when there is none.
export const fmt = (n, digits = 0) => (n === undefined || n === null ? "–"
  : Number(n).toLocaleString("en-US", { maximumFractionDigits: digits }));

export function fmtMs(ms) {
  if (ms === undefined || ms === null) return "–";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 120000) return `${(ms / 1000).toFixed(1)} s`;
  return `${Math.round(ms / 60000)} min`;
}

// A time lag the cluster has not told yet is null: "unknown", never a 0 that says caught up.
export const fmtTimeLag = (ms) => (ms === null ? "unknown" : fmtMs(ms));

export const plural = (n, word) => `${fmt(n)} ${word}${n === 1 ? "" : "s"}`;

// Locale formatting is slow enough to show in a frame's profile: remember what it gave.
const clockTexts = new Map();
export function clock(ts) {
  if (!clockTexts.has(ts)) {
    if (clockTexts.size >= 1000) clockTexts.clear();
    clockTexts.set(ts, new Date(ts).toLocaleTimeString("en-GB", { hour12: false }));
  }
  return clockTexts.get(ts);
}
