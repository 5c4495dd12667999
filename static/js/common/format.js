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

// A name cut to at most `max` characters, its ends kept (the end more: queue numbers,
// pids), "…" where the middle was; the whole name belongs in a title attribute beside it.
export function shortName(name, max = 16) {
  const text = String(name);
  if (text.length <= max) return text;
  const tail = Math.ceil((max - 1) * 0.6), head = max - 1 - tail;
  return `${text.slice(0, head)}…${text.slice(-tail)}`;
}

// A RocketMQ client id (IP@instance, e.g. a peer's 192.0.2.2@ali-ons-13877) as short: its
// instance is what tells two clients of one machine apart, so it is kept when it fits.
export function shortCid(cid, max = 16) {
  const text = String(cid);
  if (text.length <= max) return text;
  const at = text.lastIndexOf("@");
  if (at > 0 && text.length - at < max) return `…${text.slice(at)}`;
  return shortName(text, max);
}
