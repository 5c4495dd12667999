// The live page's state: the server's snapshots and events folded into plain data (pure:
// no DOM, the clock passed in). The server's state is the truth: a snapshot replaces each
// group, and between snapshots events only add the figures they carry (assignments,
// ProcessQueues, offsets, pops, topics). Who is in a group, a consumer's status and whether
// it is alive come from the snapshots alone (consumers_app/lab/state.py decides them).
//
// Views read the state and compare its version counters to skip work nothing changed.
import { POP_WINDOW, changedCount } from "./queues.js";
import { appendLag, emptySeries } from "./lagseries.js";

const LOG_LENGTH = 200;
export const FLOW_WINDOW_MS = 10 * 60 * 1000;

export function createLab() {
  return {
    groups: {},     // name -> group model (see groupFrom)
    topics: {},     // topic -> queue labels
    brokers: {},    // broker -> {online}
    producers: {},  // topic -> {rate, ...}
    cluster: { attached: false },   // runlab --namesrv: {attached, namesrv, disabled: {control: why}}
    brokerProcess: null,            // runlab's broker process: {up, restarts, reason, gave_up}
    disk: null,                     // bytes on disk per part (the controller's disk.py)
    historyService: null,           // what keeping the lag history fresh costs
    flow: [],       // flow_control events, oldest first
    log: [],        // membership / fault / broker events, oldest first
    seen: new Set(),  // keys of logged events (snapshots repeat them)
    lagSeries: new Map(),   // group -> the last 5 minutes of its lag (lagseries.js)
    // Bumped on change, for the views: the topics' queues (every group's queues may have
    // changed), the log, the flow-control events, the status lines and the cluster.
    topicsVersion: 0, logVersion: 0, flowVersion: 0, statusVersion: 0, clusterVersion: 0,
  };
}

// The page's own state (the tests make their own with createLab).
export const lab = createLab();

function groupFrom(name, snap, previous) {
  const g = {
    name,
    version: 0,
    strategy: snap.strategy,
    mode: snap.mode,
    topic: snap.topic,
    observed: !!snap.observed,   // watched on the cluster, not run by the lab: read-only
    clients: snap.clients || {},   // client id -> {status, alive, slow_ms, fail_ratio, client, ...}
    assignments: {},
    queues: {},
    // Per (queue, client) ProcessQueue figures; "*" holds the snapshot's per-queue totals
    // until a consumer reports its own.
    pq: {},
    lastRebalance: snap.last_rebalance || (previous && previous.lastRebalance) || null,   // the last that moved queues
    noopRebalances: snap.noop_rebalances || {},   // client -> rebalances that changed nothing
    // Messages retention deleted before the group consumed them, summed over its queues.
    skipped: Object.values(snap.skipped || {}).reduce((sum, n) => sum + n, 0),
    routeChange: snap.route_change || null,   // the last queue/broker change and who noticed it when
    // The last 15 minutes' rebalances that moved queues, and their totals (handoff.py).
    handoffs: snap.handoffs || (previous && previous.handoffs) || { totals: {}, rebalances: [] },
    pops: (previous && previous.pops) || {},   // queue -> recent receivers, newest last
  };
  for (const [cid, labels] of Object.entries(snap.assignments || {})) g.assignments[cid] = [...labels];
  for (const [label, q] of Object.entries(snap.queues || {})) {
    g.queues[label] = { ...q };
    g.pq[label] = { "*": { cached_count: q.cached_count || 0, cached_bytes: q.cached_bytes || 0, span: q.span || 0 } };
  }
  return g;
}

// A snapshot (the websocket's first frame, one a poll, and every control action's answer).
export function applySnapshot(lab, snap, now = Date.now()) {
  const groups = {};
  for (const [name, g] of Object.entries(snap.groups || {})) {
    groups[name] = groupFrom(name, g, lab.groups[name]);
    for (const e of g.membership_log || []) logEvent(lab, { ...e, type: e.type || "membership", group: e.group || name });
    for (const e of g.fault_log || []) logEvent(lab, { ...e, group: e.group || name });
    for (const e of g.flow_control || []) flowEvent(lab, { ...e, type: "flow_control", group: e.group || name }, now);
  }
  lab.groups = groups;
  for (const [name, g] of Object.entries(groups)) {
    if (!lab.lagSeries.has(name)) lab.lagSeries.set(name, emptySeries());
    appendLag(lab.lagSeries.get(name), g, now);
  }
  if (snap.topics) {
    lab.topics = snap.topics;
    lab.topicsVersion += 1;
  }
  if (snap.brokers) lab.brokers = snap.brokers;
  if (snap.producers) lab.producers = snap.producers;
  if (snap.broker_process) lab.brokerProcess = snap.broker_process;
  if (snap.cluster) {
    lab.cluster = snap.cluster;
    lab.clusterVersion += 1;
  }
  if (snap.disk) lab.disk = snap.disk;
  lab.historyService = snap.history_service || null;
  lab.statusVersion += 1;
}

function eventKey(e) {
  return [e.ts, e.type, e.group, e.client_id, e.change || e.fault || e.phase || e.reason || "", e.queue || "", e.broker || ""].join("|");
}

const membershipKey = (e) => [e.group, e.change || e.reason, e.members, e.joined, e.left].map(String).join("|");

// A line of the membership & faults log, once (snapshots repeat what events told).
function logEvent(lab, e) {
  const key = eventKey(e);
  if (lab.seen.has(key)) return;
  lab.seen.add(key);
  if (e.type === "membership") {
    // The same change, reported by the broker and by each member: keep the first report.
    const previous = lab.log.findLast((x) => x.type === "membership" && x.group === e.group);
    if (previous && membershipKey(previous) === membershipKey(e)) return;
  }
  lab.log.push(e);
  lab.log.sort((a, b) => a.ts - b.ts);
  while (lab.log.length > LOG_LENGTH) lab.seen.delete(eventKey(lab.log.shift()));
  lab.logVersion += 1;
}

// A flow-control event of the last FLOW_WINDOW_MS, once.
function flowEvent(lab, e, now) {
  const key = eventKey(e);
  if (lab.seen.has(key)) return;
  lab.seen.add(key);
  lab.flow.push(e);
  lab.flow.sort((a, b) => a.ts - b.ts);
  const horizon = now - FLOW_WINDOW_MS;
  while (lab.flow.length && (lab.flow[0].ts < horizon || lab.flow.length > 2000)) lab.seen.delete(eventKey(lab.flow.shift()));
  lab.flowVersion += 1;
}

// One event of the websocket (dashboard/consumers.py), between snapshots.
export function applyEvent(lab, e, now = Date.now()) {
  const g = lab.groups[e.group];
  if (g) g.version += 1;   // its views compare this to skip groups nothing happened to
  switch (e.type) {
    case "assignment":
      // As the server does: a late report of a consumer it has declared gone changes nothing.
      if (g && g.clients[e.client_id]?.alive !== false) {
        g.assignments[e.client_id] = [...(e.queues || [])];
        if (e.strategy) g.strategy = e.strategy;
      }
      break;
    case "rebalance":
      // Only a rebalance that moved queues is shown: the periodic ones (every 20 s per
      // consumer) change nothing and would bury it. The server counts those, and every
      // snapshot brings the counts (counting events here too would count some twice).
      if (g && (e.phase || "end") === "end" && changedCount(e)) g.lastRebalance = e;
      break;
    case "pq":
      if (g && e.queue) {
        const per = (g.pq[e.queue] = g.pq[e.queue] || {});
        delete per["*"];
        per[e.client_id] = e;
      }
      break;
    case "offset":
      // What the clients emit: {topic, offsets: {label: committed offset}} (changed ones only).
      if (g && e.offsets && (!e.topic || e.topic === g.topic)) {
        for (const [label, offset] of Object.entries(e.offsets)) if (g.queues[label]) g.queues[label].committed_offset = offset;
      }
      break;
    case "pop":
      if (g && (e.action || "received") === "received") {
        // Per queue when the client says ({label: count}); else one label, often
        // BROKER:-1 ("any queue of that broker"), which stands for each of its queues.
        const counts = e.queues && !Array.isArray(e.queues) ? e.queues : { [e.queue]: e.count || 1 };
        for (const [label, n] of Object.entries(counts)) {
          const recent = (g.pops[label] = g.pops[label] || []);
          for (let i = 0; i < Math.min(n, POP_WINDOW); i++) recent.push(e.client_id);
          recent.splice(0, Math.max(0, recent.length - POP_WINDOW));
        }
      }
      break;
    case "flow_control":
      flowEvent(lab, e, now);
      break;
    case "membership":
    case "fault":
      // A line of the log; what it does to the group (who is in it, a consumer's status
      // and faults) the server decides, and its next snapshot says.
      logEvent(lab, e);
      break;
    case "offset_moved":
      // The count comes with the next snapshot (a second away); counting events too would
      // count twice the ones a snapshot already holds.
      if (e.skipped) logEvent(lab, e);   // a correction backwards skips nothing: not worth a line
      break;
    case "broker":
      logEvent(lab, e);
      if (e.topic && e.queues) {
        lab.topics[e.topic] = [...e.queues];
        lab.topicsVersion += 1;
      }
      if (e.broker && "online" in e) lab.brokers[e.broker] = { online: !!e.online };
      if (e.process) {
        lab.brokerProcess = { up: e.process === "up", restarts: e.restarts, reason: e.reason };
        lab.statusVersion += 1;
      }
      break;
    default:
      break;
  }
}
