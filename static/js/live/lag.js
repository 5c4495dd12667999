// Lag lines and replay. The controller keeps a sample a second of the last 15 minutes
// (timeline.py). The page asks it once for the last 5 minutes of lag, then appends each
// snapshot's figures (model.js, lagseries.js): each queue's lag as a sparkline (matrix
// row, grid tooltip), the group's total lag and time lag as lines. The Replay slider
// shows the assignment view at a past second instead.
import { el, setText } from "../common/dom.js";
import { clock, fmt, fmtMs, fmtTimeLag } from "../common/format.js";
import { request } from "./api.js";
import { mergeLoaded } from "./lagseries.js";
import { lab } from "./model.js";
import { scheduleRender } from "./schedule.js";
import { drawSparkline } from "./sparkline.js";

const LOAD_TRIES = 3;
const replays = new Map();     // group -> the sample shown instead of now ({ts, queues})

// The kept last 5 minutes, before what the snapshots add; asked again after a 429/503's
// Retry-After. Without it the lines start empty and fill from the snapshots.
export async function loadLagSeries(name, tries = LOAD_TRIES) {
  const answer = await request(`/api/groups/${encodeURIComponent(name)}/lag?seconds=300`);
  if (!answer.ok) {
    if (answer.retryAfter && tries > 1) setTimeout(() => loadLagSeries(name, tries - 1), answer.retryAfter * 1000);
    return;
  }
  lab.lagSeries.set(name, mergeLoaded(lab.lagSeries.get(name), answer.data));
  scheduleRender();
}

export function showLagLines(card, g) {
  const host = card.querySelector('[data-role="lag-lines"]');
  const s = lab.lagSeries.get(g.name);
  if (!s || !s.ts.length) return;
  if (host.shownVersion === s.version) return;
  host.shownVersion = s.version;
  if (!host.firstChild) {
    host.append(el("span", { class: "lag-line", "data-role": "total-lag" }, el("span", { class: "what" }), el("span", { class: "line" })),
      el("span", { class: "lag-line", "data-role": "time-lag" }, el("span", { class: "what" }), el("span", { class: "line" })));
  }
  const [total, time] = host.children;
  setText(total.firstChild, `total lag ${fmt(s.total.at(-1))} (5 min peak ${fmt(Math.max(...s.total))})`);
  const known = s.time.filter((v) => v !== null);
  setText(time.firstChild, `time lag ${fmtTimeLag(s.time.at(-1))}`
    + (known.length ? ` (5 min peak ${fmtTimeLag(Math.max(...known))})` : ""));
  drawSparkline(total.lastChild, s.total, 240, 28);
  drawSparkline(time.lastChild, s.time, 240, 28, "log");
}

// The sample replayed for the group, or undefined when it is live.
export const replayOf = (name) => replays.get(name);

let replayTimer = null;
export function replayAt(card, name, secondsAgo) {
  clearTimeout(replayTimer);
  const state = card.querySelector('[data-role="replay-state"]');
  const live = card.querySelector('[data-action="live"]');
  if (secondsAgo >= 0) {
    replays.delete(name);
    setText(state, "live");
    live.hidden = true;
    delete card.dataset.replay;
    return scheduleRender();
  }
  // Ask once the slider rests for a moment: dragging it must not flood the server.
  replayTimer = setTimeout(async () => {
    const ts = Date.now() + secondsAgo * 1000;
    const answer = await request(`/api/groups/${encodeURIComponent(name)}/at?ts=${Math.round(ts)}`);
    if (Number(card.querySelector('[data-role="replay"]').value) !== secondsAgo) return;   // moved on meanwhile
    if (!answer.ok) {
      setText(state, answer.error || "nothing kept for that time");
      return;
    }
    const sample = answer.data;
    replays.set(name, sample);
    card.dataset.replay = String(sample.ts);
    setText(state, `replaying ${clock(sample.ts)} (${fmtMs(Date.now() - sample.ts)} ago)`);
    live.hidden = false;
    scheduleRender();
  }, 150);
}

// The group as the replayed second saw it: owners, lag and cached messages per queue.
export function replayedGroup(g, replay) {
  const assignments = {};
  const queues = {}, pq = {};
  for (const [label, q] of Object.entries(replay.queues)) {
    for (const cid of q.owners) (assignments[cid] = assignments[cid] || []).push(label);
    queues[label] = { lag: q.lag, time_lag_ms: q.time_lag_ms };
    pq[label] = { "*": { cached_count: q.cached_count, cached_bytes: 0, span: 0 } };
  }
  return { ...g, assignments, queues, pq, pops: {} };
}
