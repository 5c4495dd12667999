// What a group's state says about its queues and consumers: labels in RocketMQ's order,
// who claims each queue, ProcessQueue totals (pure: no DOM). Queue labels are BROKER:QID;
// a pop client's BROKER:-1 stands for every queue of BROKER.
import { MIB, javaOrder } from "../common/format.js";

// RocketMQ's defaults: pullThresholdForQueue, pullThresholdSizeForQueue, consumeConcurrentlyMaxSpan.
export const THRESHOLDS = { cached_count: 1000, cached_mib: 100, span: 2000 };
export const POP_WINDOW = 24;          // recent pop receptions remembered per queue

export function splitLabel(label) {
  const i = label.lastIndexOf(":");
  return [label.slice(0, i), Number(label.slice(i + 1))];
}

export function queueOrder(a, b) {
  const [ba, qa] = splitLabel(a), [bb, qb] = splitLabel(b);
  return javaOrder(ba, bb) || qa - qb;
}

// The group's queues: those with figures, its topic's, and (push, lite pull) any a consumer claims.
export function queuesOf(g, topicQueues = []) {
  const labels = new Set(Object.keys(g.queues));
  for (const label of topicQueues) labels.add(label);
  if (g.mode !== "pop") {
    for (const list of Object.values(g.assignments)) for (const label of list) if (!label.endsWith(":-1")) labels.add(label);
  }
  return [...labels].sort(queueOrder);
}

// Which clients claim each queue: label -> client ids, sorted. Each consumer rebalances
// on its own, so while a rebalance is under way two may claim a queue, or none.
// One pass over the assignments: asking per queue would cost queues × consumers at 1024 × 128.
export function ownerIndex(g, queues) {
  const index = new Map(queues.map((label) => [label, []]));
  const byBroker = new Map();
  for (const label of queues) {
    const broker = splitLabel(label)[0];
    if (!byBroker.has(broker)) byBroker.set(broker, []);
    byBroker.get(broker).push(label);
  }
  for (const [cid, labels] of Object.entries(g.assignments)) {
    for (const label of labels) {
      const covered = label.endsWith(":-1") ? byBroker.get(splitLabel(label)[0]) || [] : [label];
      for (const x of covered) {
        const list = index.get(x);
        if (list && list.at(-1) !== cid) list.push(cid);
      }
    }
  }
  for (const list of index.values()) list.sort(javaOrder);
  return index;
}

// Recent receivers of a pop group's queue: its own record, else its broker's (BROKER:-1).
export const popsOf = (g, label) => g.pops[label] || g.pops[`${splitLabel(label)[0]}:-1`] || [];

export function consumersOf(g) {
  const ids = new Set([...Object.keys(g.clients), ...Object.keys(g.assignments)]);
  return [...ids].sort(javaOrder);
}

// The server says whether a consumer still takes part (its snapshot's `alive`); one only
// an event has named so far is taken as alive until the next snapshot says otherwise.
export const isAlive = (g, cid) => g.clients[cid]?.alive !== false;

// A queue's ProcessQueue figures: the snapshot's totals, or what its holders report.
export function pqTotals(g, label, holders) {
  const per = g.pq[label] || {};
  const rows = Object.entries(per).filter(([cid]) => cid === "*" || holders.includes(cid) || g.mode === "pop").map(([, v]) => v);
  return {
    cached_count: rows.reduce((s, r) => s + (r.cached_count || 0), 0),
    cached_bytes: rows.reduce((s, r) => s + (r.cached_bytes || 0), 0),
    span: rows.reduce((m, r) => Math.max(m, r.span || 0), 0),
  };
}

// What a view shows of one queue. Push and lite pull: who claims it ("owned"; "contested"
// or "unowned" while a rebalance is under way). Pop shares queues by design: who recently
// received its messages ("received" or "idle"), the latest of them as `owner`.
export function queueFacts(g, label, holders) {
  if (g.mode === "pop") {
    const recent = popsOf(g, label);
    const owners = [...new Set(recent)].sort(javaOrder);
    return { owners, state: owners.length ? "received" : "idle", owner: recent.at(-1) || "" };
  }
  const state = holders.length === 1 ? "owned" : holders.length ? "contested" : "unowned";
  return { owners: holders, state, owner: state === "owned" ? holders[0] : "" };
}

export const isHot = (t) => t.cached_count >= THRESHOLDS.cached_count || t.cached_bytes / MIB >= THRESHOLDS.cached_mib
  || t.span >= THRESHOLDS.span;

// How close a queue's ProcessQueue is to flow control: its highest figure/threshold ratio.
export const depth = (t) => Math.max(t.cached_count / THRESHOLDS.cached_count, t.cached_bytes / MIB / THRESHOLDS.cached_mib,
  t.span / THRESHOLDS.span);

// The deepest `max` of `queues`, in queue order (all of them when they are few).
export function deepest(queues, totals, max) {
  if (queues.length <= max) return queues;
  const chosen = new Set([...queues].sort((a, b) => depth(totals.get(b)) - depth(totals.get(a))).slice(0, max));
  return queues.filter((label) => chosen.has(label));
}

// Queues a rebalance took or released.
export const changedCount = (r) => (r.changed || []).length + (r.added || []).length + (r.removed || []).length;

// RocketMQ's own topics: TopicValidator's system topics, the groups' retry and dead-letter
// ones (%RETRY%G, %DLQ%G), rmq_sys_* and RMQ_SYS_*, and the default cluster's own.
const SYSTEM_TOPICS = new Set(["SCHEDULE_TOPIC_XXXX", "TBW102", "OFFSET_MOVED_EVENT", "SELF_TEST_TOPIC", "BenchmarkTest",
  "TRANS_CHECK_MAX_TIME_TOPIC", "CHECKPOINT_TOPIC", "DefaultHeartBeatSyncerTopic", "DefaultCluster"]);
export const isSystemTopic = (t) => t.startsWith("%") || SYSTEM_TOPICS.has(t) || /^(RMQ_SYS_|rmq_sys_)/i.test(t);

// The topics a user may send to or resize, in Java's order: never RocketMQ's own, nor a
// broker's name (a broker registers a topic of its own name).
export const userTopics = (topics, brokers = []) =>
  topics.filter((t) => !isSystemTopic(t) && !brokers.includes(t)).sort(javaOrder);

// The topic a menu starts on: the lab's own (its producer's; else its first group's), not
// whichever sorts first.
export function labTopic(topics, producers = {}, groups = {}) {
  const candidates = [...Object.keys(producers).sort(javaOrder),
    ...Object.keys(groups).sort(javaOrder).map((name) => groups[name].topic)];
  return candidates.find((t) => topics.includes(t)) ?? topics[0] ?? "";
}
