// The page's reducer (live/model.js): snapshots replace, events add figures, and who is in
// a group and how its consumers are is the server's to say.
import assert from "node:assert/strict";
import { test } from "node:test";
import { applyEvent, applySnapshot, createLab } from "../live/model.js";

const NOW = 1_700_000_000_000;

function snapshot(fields = {}) {
  return {
    type: "snapshot",
    groups: {
      GID: {
        strategy: "AVG", mode: "push", topic: "T", observed: false,
        clients: { c1: { status: "running", alive: true }, c2: { status: "running", alive: true } },
        assignments: { c1: ["a:0"], c2: ["a:1"] },
        queues: { "a:0": { lag: 3, time_lag_ms: 100, cached_count: 2 }, "a:1": { lag: 4, time_lag_ms: null } },
        membership_log: [{ ts: NOW - 10, type: "membership", group: "GID", change: "joined", joined: ["c2"], members: ["c1", "c2"] }],
        flow_control: [],
        noop_rebalances: { c1: 2 }, skipped: { "a:0": 5, "a:1": 1 },
      },
    },
    topics: { T: ["a:0", "a:1"] },
    brokers: { a: { online: true } },
    producers: { T: { rate: 100 } },
    cluster: { attached: false },
    broker_process: { up: true },
    history_service: null,
    ...fields,
  };
}

test("a snapshot sets the groups, topics, brokers and the status lines", () => {
  const lab = createLab();
  applySnapshot(lab, snapshot(), NOW);
  const g = lab.groups.GID;
  assert.deepEqual(g.assignments, { c1: ["a:0"], c2: ["a:1"] });
  assert.equal(g.skipped, 6);
  assert.deepEqual(g.pq["a:0"], { "*": { cached_count: 2, cached_bytes: 0, span: 0 } });
  assert.deepEqual(lab.topics, { T: ["a:0", "a:1"] });
  assert.equal(lab.topicsVersion, 1);
  assert.deepEqual(lab.brokerProcess, { up: true });
  assert.equal(lab.log.length, 1);
  // One lag sample per snapshot: the total, and the largest time lag known.
  const series = lab.lagSeries.get("GID");
  assert.deepEqual([series.ts, series.total, series.time], [[NOW], [7], [100]]);
});

test("snapshots repeat the log: each line is kept once", () => {
  const lab = createLab();
  applySnapshot(lab, snapshot(), NOW);
  applySnapshot(lab, snapshot(), NOW + 1000);
  assert.equal(lab.log.length, 1);
  assert.equal(lab.lagSeries.get("GID").ts.length, 2);
});

test("a fault event is logged; the consumer's status changes only with the server's snapshot", () => {
  const lab = createLab();
  applySnapshot(lab, snapshot(), NOW);
  applyEvent(lab, { ts: NOW + 1, type: "fault", group: "GID", client_id: "c2", fault: "kill" }, NOW + 1);
  assert.deepEqual(lab.groups.GID.clients.c2, { status: "running", alive: true });
  assert.equal(lab.log.at(-1).fault, "kill");

  const after = snapshot();
  after.groups.GID.clients.c2 = { status: "killed", alive: false };
  delete after.groups.GID.assignments.c2;
  applySnapshot(lab, after, NOW + 1000);
  assert.deepEqual(lab.groups.GID.clients.c2, { status: "killed", alive: false });
  assert.deepEqual(lab.groups.GID.assignments, { c1: ["a:0"] });
});

test("a page opened later logs the faults the server kept, once with the live event", () => {
  const lab = createLab();
  const switched = { ts: NOW - 5, type: "fault", group: "GID", client_id: "", fault: "strategy", strategy: "AVG_BY_CIRCLE" };
  const snap = snapshot();
  snap.groups.GID.fault_log = [switched, { ts: NOW - 4, type: "offset_moved", group: "GID", client_id: "c1", queue: "a:0", skipped: 5 }];
  applySnapshot(lab, snap, NOW);
  assert.deepEqual(lab.log.map((e) => e.type), ["membership", "fault", "offset_moved"]);
  applyEvent(lab, { ...switched }, NOW + 1);   // the same switch, live: still one line
  applySnapshot(lab, snap, NOW + 1000);
  assert.equal(lab.log.filter((e) => e.type === "fault").length, 1);
});

test("a membership event is logged and leaves the assignments as the server has them", () => {
  const lab = createLab();
  applySnapshot(lab, snapshot(), NOW);
  applyEvent(lab, { ts: NOW + 1, type: "membership", group: "GID", change: "left", left: ["c2"], members: ["c1"] }, NOW + 1);
  assert.deepEqual(lab.groups.GID.assignments, { c1: ["a:0"], c2: ["a:1"] });
  assert.equal(lab.log.length, 2);
  // The same change as each member reports it again: one line.
  applyEvent(lab, { ts: NOW + 2, type: "membership", group: "GID", change: "left", left: ["c2"], members: ["c1"], client_id: "c1" }, NOW + 2);
  assert.equal(lab.log.length, 2);
});

test("an assignment event moves queues between snapshots, but not for a consumer the server says is gone", () => {
  const lab = createLab();
  const snap = snapshot();
  snap.groups.GID.clients.c3 = { status: "killed", alive: false };
  applySnapshot(lab, snap, NOW);
  const version = lab.groups.GID.version;
  applyEvent(lab, { ts: NOW + 1, type: "assignment", group: "GID", client_id: "c1", queues: ["a:0", "a:1"], strategy: "HASH" });
  applyEvent(lab, { ts: NOW + 2, type: "assignment", group: "GID", client_id: "c3", queues: ["a:1"] });
  applyEvent(lab, { ts: NOW + 3, type: "assignment", group: "GID", client_id: "c4", queues: ["a:1"] });
  const g = lab.groups.GID;
  assert.deepEqual(g.assignments, { c1: ["a:0", "a:1"], c2: ["a:1"], c4: ["a:1"] });
  assert.equal(g.strategy, "HASH");
  assert.equal(g.version, version + 3);
  assert.equal(g.clients.c4, undefined);   // the next snapshot tells who it is
});

test("figure events: ProcessQueues, committed offsets, pops", () => {
  const lab = createLab();
  const snap = snapshot();
  applySnapshot(lab, snap, NOW);
  applyEvent(lab, { ts: NOW + 1, type: "pq", group: "GID", client_id: "c1", queue: "a:0", cached_count: 9 });
  applyEvent(lab, { ts: NOW + 2, type: "offset", group: "GID", topic: "T", offsets: { "a:1": 42, "z:9": 1 } });
  const g = lab.groups.GID;
  assert.deepEqual(Object.keys(g.pq["a:0"]), ["c1"]);
  assert.equal(g.queues["a:1"].committed_offset, 42);
  assert.equal(g.queues["z:9"], undefined);

  snap.groups.GID.mode = "pop";
  applySnapshot(lab, snap, NOW + 1000);
  applyEvent(lab, { ts: NOW + 3, type: "pop", group: "GID", client_id: "c2", queue: "a:-1", count: 30 });
  applyEvent(lab, { ts: NOW + 4, type: "pop", group: "GID", client_id: "c1", queues: { "a:0": 2 } });
  assert.equal(lab.groups.GID.pops["a:-1"].length, 24);   // the last POP_WINDOW receptions
  assert.deepEqual(lab.groups.GID.pops["a:0"], ["c1", "c1"]);
});

test("broker events: a topic's queues, a broker's state and the broker process", () => {
  const lab = createLab();
  applySnapshot(lab, snapshot(), NOW);
  applyEvent(lab, { ts: NOW + 1, type: "broker", broker: "a", change: "queues", topic: "T", queues: ["a:0", "a:1", "a:2"], delta: 1 });
  applyEvent(lab, { ts: NOW + 2, type: "broker", broker: "a", change: "offline", online: false });
  applyEvent(lab, { ts: NOW + 3, type: "broker", process: "down", reason: "exit 1", restarts: 1 });
  assert.deepEqual(lab.topics.T, ["a:0", "a:1", "a:2"]);
  assert.equal(lab.topicsVersion, 2);
  assert.deepEqual(lab.brokers.a, { online: false });
  assert.deepEqual(lab.brokerProcess, { up: false, restarts: 1, reason: "exit 1" });
  assert.equal(lab.log.length, 4);
});

test("flow control: the last 10 minutes, once each", () => {
  const lab = createLab();
  const e = (ts) => ({ ts, type: "flow_control", group: "GID", client_id: "c1", queue: "a:0", reason: "count" });
  applyEvent(lab, e(NOW - 11 * 60 * 1000), NOW);
  applyEvent(lab, e(NOW - 1000), NOW);
  applyEvent(lab, e(NOW - 1000), NOW);
  assert.deepEqual(lab.flow.map((x) => x.ts), [NOW - 1000]);
});
