// What a group's state says about its queues (live/queues.js).
import assert from "node:assert/strict";
import { test } from "node:test";
import { consumersOf, isAlive, isSystemTopic, labTopic, ownerIndex, pqTotals, queueFacts, queuesOf, userTopics } from "../live/queues.js";

const group = (fields) => ({ mode: "push", clients: {}, assignments: {}, queues: {}, pq: {}, pops: {}, ...fields });

test("queues sort by broker, then numerically by queue id", () => {
  const g = group({ queues: { "b:0": {} }, assignments: { c1: ["a:10", "a:2"] } });
  assert.deepEqual(queuesOf(g, ["a:1"]), ["a:1", "a:2", "a:10", "b:0"]);
});

test("a pop client's BROKER:-1 covers each queue of that broker, and is no queue itself", () => {
  const g = group({ mode: "pop", assignments: { c1: ["a:-1"], c2: ["a:1"] } });
  const queues = queuesOf(g, ["a:0", "a:1", "b:0"]);
  assert.deepEqual(queues, ["a:0", "a:1", "b:0"]);
  const owners = ownerIndex(g, queues);
  assert.deepEqual(owners.get("a:0"), ["c1"]);
  assert.deepEqual(owners.get("a:1"), ["c1", "c2"]);
  assert.deepEqual(owners.get("b:0"), []);
});

test("a queue is owned, contested or unowned by how many claim it", () => {
  const g = group({});
  assert.deepEqual(queueFacts(g, "a:0", ["c1"]), { owners: ["c1"], state: "owned", owner: "c1" });
  assert.equal(queueFacts(g, "a:0", ["c1", "c2"]).state, "contested");
  assert.equal(queueFacts(g, "a:0", []).state, "unowned");
});

test("pop: a queue shows who received from it lately, the latest as owner", () => {
  const g = group({ mode: "pop", pops: { "a:-1": ["c2", "c1", "c2"] } });
  assert.deepEqual(queueFacts(g, "a:3", []), { owners: ["c1", "c2"], state: "received", owner: "c2" });
  assert.equal(queueFacts(g, "b:0", []).state, "idle");
});

test("alive is the server's word; a consumer only an event named yet counts as alive", () => {
  const g = group({ clients: { c1: { status: "running", alive: true }, c2: { status: "killed", alive: false } },
    assignments: { c3: ["a:0"] } });
  assert.deepEqual(consumersOf(g), ["c1", "c2", "c3"]);
  assert.deepEqual(consumersOf(g).filter((c) => isAlive(g, c)), ["c1", "c3"]);
});

test("ProcessQueue totals: the snapshot's, or what the holders report", () => {
  const g = group({ pq: { "a:0": { c1: { cached_count: 5, cached_bytes: 10, span: 3 }, c2: { cached_count: 7, cached_bytes: 1, span: 9 } } } });
  assert.deepEqual(pqTotals(g, "a:0", ["c1"]), { cached_count: 5, cached_bytes: 10, span: 3 });
  assert.deepEqual(pqTotals(g, "a:1", []), { cached_count: 0, cached_bytes: 0, span: 0 });
});

test("system topics are the broker's own", () => {
  assert.ok(isSystemTopic("%RETRY%GID_LAB"));
  assert.ok(isSystemTopic("RMQ_SYS_TRACE_TOPIC"));
  assert.ok(!isSystemTopic("TopicTest"));
});

test("topic menus offer the user's topics only, and start on the lab's", () => {
  const all = ["%RETRY%GID_LAB", "%DLQ%GID_LAB", "SCHEDULE_TOPIC_XXXX", "TBW102", "rmq_sys_wheel_timer", "RMQ_SYS_TRACE_TOPIC",
    "broker-a", "Alpha", "TopicTest", "OFFSET_MOVED_EVENT"];
  const offered = userTopics(all, ["broker-a", "broker-b"]);
  assert.deepEqual(offered, ["Alpha", "TopicTest"]);
  assert.equal(labTopic(offered, { TopicTest: { rate: 200 } }, {}), "TopicTest");
  assert.equal(labTopic(offered, {}, { GID_LAB: { topic: "TopicTest" } }), "TopicTest");
  assert.equal(labTopic(offered, { "%RETRY%GID_LAB": {} }, {}), "Alpha");   // no lab topic offered: the first
  assert.equal(labTopic([], {}, {}), "");
});
