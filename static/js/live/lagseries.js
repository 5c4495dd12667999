// The last 5 minutes of each group's lag, one sample per snapshot (pure: no DOM): each
// queue's lag (sparklines), the group's total lag and time lag (lines). The page asks the
// controller once for what it kept (mergeLoaded), then appends each snapshot (appendLag).

export const SERIES_MS = 5 * 60 * 1000;

// {version, ts: [], total: [], time: [], queues: Map(label -> [lag or null])}, all as long as ts.
export const emptySeries = () => ({ version: 0, ts: [], total: [], time: [], queues: new Map() });

export function appendLag(s, g, now) {
  const n = s.ts.length;
  let total = 0, time = null;   // null: no queue's time lag known
  for (const [label, q] of Object.entries(g.queues)) {
    total += q.lag || 0;
    if (q.time_lag_ms !== null && q.time_lag_ms !== undefined) time = Math.max(time || 0, q.time_lag_ms);
    let values = s.queues.get(label);
    if (!values) s.queues.set(label, (values = new Array(n).fill(null)));
    values.push(q.lag || 0);
  }
  for (const values of s.queues.values()) if (values.length === n) values.push(null);
  s.ts.push(now);
  s.total.push(total);
  s.time.push(time);
  let drop = 0;
  while (drop < s.ts.length && s.ts[drop] < now - SERIES_MS) drop += 1;
  if (drop) {
    for (const key of ["ts", "total", "time"]) s[key].splice(0, drop);
    for (const [label, values] of s.queues) {
      values.splice(0, drop);
      if (values.every((v) => v === null)) s.queues.delete(label);
    }
  }
  s.version += 1;
}

// The controller's answer (GET /api/groups/G/lag: {ts, total_lag, time_lag_ms, queues}) before
// what the snapshots added meanwhile (`mine`, or nothing).
export function mergeLoaded(mine, loaded) {
  const since = mine && mine.ts.length ? mine.ts[0] : Infinity;
  const keep = loaded.ts.filter((ts) => ts < since).length;
  const merged = { version: (mine?.version || 0) + 1, ts: loaded.ts.slice(0, keep), total: loaded.total_lag.slice(0, keep),
    time: loaded.time_lag_ms.slice(0, keep),
    queues: new Map(Object.entries(loaded.queues).map(([label, v]) => [label, v.slice(0, keep)])) };
  if (mine) {
    merged.ts.push(...mine.ts);
    merged.total.push(...mine.total);
    merged.time.push(...mine.time);
    const n = mine.ts.length;
    for (const [label, values] of mine.queues) {
      const before = merged.queues.get(label) || new Array(keep).fill(null);
      merged.queues.set(label, before.concat(values));
    }
    for (const values of merged.queues.values()) if (values.length < keep + n) values.push(...new Array(keep + n - values.length).fill(null));
  }
  return merged;
}
