// One card per consumer group: its head (strategy, mode), rebalance lines, hand-off strip,
// lag lines and replay, the assignment view, the ProcessQueue chart, and (for a user who
// may steer it) its consumer controls. Built once, then updated from the model each frame
// that changed the group.
import { el, setAttr, setData, setText, showInForce } from "../common/dom.js";
import { clock, fmt, fmtMs, javaOrder } from "../common/format.js";
import { callApi } from "./actions.js";
import { dropView, updateAssignmentView } from "./assignment.js";
import { followSize } from "./charts.js";
import { ACTIONS, CLIENTS, MODES, STRATEGIES, canControl } from "./config.js";
import { numberIn, showError } from "./errors.js";
import { lastRebalanceLine, showHandoffs } from "./handoffs.js";
import { noopText } from "./labels.js";
import { loadLagSeries, replayAt, replayOf, replayedGroup, showLagLines } from "./lag.js";
import { lab } from "./model.js";
import { disableClusterControls } from "./panels.js";
import { consumersOf, isAlive, queuesOf } from "./queues.js";
import { movesOf, previewStrategy, refreshPreview } from "./whatif.js";

// A card per group, in Java's order; cards of groups gone from the state leave.
export function renderGroups() {
  const host = document.getElementById("groups");
  const names = Object.keys(lab.groups).sort(javaOrder);
  if (!names.length) return;
  host.querySelector(".empty")?.remove();
  for (const card of host.querySelectorAll(".group")) {
    if (!lab.groups[card.dataset.group]) {
      dropView(card.dataset.group);
      card.remove();
    }
  }
  for (const name of names) {
    let card = host.querySelector(`.group[data-group="${CSS.escape(name)}"]`);
    if (!card) {
      card = buildGroupCard(lab.groups[name]);
      disableClusterControls(card);
      host.append(card);
    }
    updateGroupCard(card, lab.groups[name]);
  }
}

function buildGroupCard(g) {
  const { name, observed } = g;
  const steer = canControl && !observed;
  const strategySelect = el("select", { name: "strategy", "data-control": "strategy", disabled: !steer, "aria-label": "allocation strategy" },
    STRATEGIES.map((s) => el("option", { value: s }, s)));
  const modeSelect = el("select", { name: "mode", "data-control": "mode", disabled: !steer, "aria-label": "consumption mode" },
    MODES.map((m) => el("option", { value: m }, m)));
  modeSelect.addEventListener("change", () =>
    callApi(`/api/groups/${encodeURIComponent(name)}/mode`, { mode: modeSelect.value }, modeSelect));

  const card = el("article", { class: "group panel", "data-group": name },
    el("header", { class: "group-head" },
      el("h2", {}, name, " ", el("small", { class: "topic" })),
      observed ? el("span", { class: "peer", "data-role": "observed",
        title: "started by someone else: the lab asks the cluster about it every second and changes nothing" }, "observed") : null,
      observed ? null : el("label", {}, "strategy ", strategySelect),
      el("label", {}, "mode ", modeSelect)),
    el("div", { class: "strategy-preview", "data-role": "strategy-preview", hidden: true }),
    el("p", { class: "rebalance" }, el("span", { "data-role": "last-rebalance" }), " ", el("span", { "data-role": "noop-rebalances" })),
    el("p", { class: "rebalance handoff-totals", "data-role": "handoff-totals" }),
    el("div", { class: "rebalance-strip", "data-role": "rebalances", role: "group",
      "aria-label": "rebalances of the last 15 minutes that moved queues: click one for its hand-offs" }),
    el("div", { class: "handoff-panel", "data-role": "handoff", hidden: true }),
    el("div", { class: "lag-lines", "data-role": "lag-lines" }),
    el("div", { class: "replay" },
      el("label", {}, "Replay ", el("input", { type: "range", "data-role": "replay", min: -900, max: 0, step: 1, value: 0,
        "aria-label": "replay the last 15 minutes: seconds before now (0 = live)" })),
      el("span", { class: "replay-state", "data-role": "replay-state" }, "live"),
      el("button", { type: "button", "data-action": "live", hidden: true }, "Back to live")),
    el("p", { class: "rebalance", "data-role": "route-change" }),
    el("p", { class: "rebalance skipped", "data-role": "skipped" }),
    el("div", { class: "matrix-wrap" }),
    el("p", { class: "rebalance chart-caption", "data-role": "pq-caption" }),
    el("div", { class: "pq-chart chart", id: `pq-${name}` }));
  if (steer) card.append(buildConsumerControls(name));
  strategySelect.addEventListener("change", () => previewStrategy(card, name, strategySelect.value));
  const slider = card.querySelector('[data-role="replay"]');
  slider.addEventListener("input", () => replayAt(card, name, Number(slider.value)));
  card.querySelector('[data-action="live"]').addEventListener("click", () => { slider.value = "0"; replayAt(card, name, 0); });
  loadLagSeries(name);
  followSize(card.querySelector(".pq-chart"));
  return card;
}

function buildConsumerControls(name) {
  const who = el("select", { name: "client_id", "aria-label": "consumer" });
  who.addEventListener("change", () => {
    const card = who.closest(".group");
    if (card && lab.groups[name]) showConsumerFaults(card, lab.groups[name]);
  });
  // `body`: the request's body, or a function of the button giving it (null: not sent, its reason shown).
  const act = (action, body = {}) => (event) => {
    const button = event.currentTarget;
    if (!who.value) return showError("Pick a consumer first.", button);
    const sent = body instanceof Function ? body(button) : body;
    if (sent) callApi(`/api/consumers/${encodeURIComponent(who.value)}/${action}`, sent, button);
  };
  const numberOf = (input, what, key) => (button) => {
    const value = numberIn(input, what, button);
    return value === null ? null : { [key]: value };
  };
  const ms = el("input", { type: "number", name: "ms", min: 0, max: 60000, step: 50, value: 200, "aria-label": "ms per message" });
  const ratio = el("input", { type: "number", name: "ratio", min: 0, max: 1, step: 0.05, value: 0.2, "aria-label": "fail ratio" });
  // Follows the group's mode (updateConsumerControls): a group takes only consumers of its own mode.
  const addMode = el("select", { name: "mode", "data-role": "add-mode", "aria-label": "mode of the new consumer" }, MODES.map((m) => el("option", { value: m }, m)));
  const addClient = el("select", { name: "client", "aria-label": "which RocketMQ client" }, CLIENTS.map((c) => el("option", { value: c }, c)));
  return el("div", { class: "consumer-controls", "data-role": "consumer-controls" },
    el("div", { class: "control" },
      el("span", { class: "label" }, "Consumer"), who,
      ["stop", "kill", "hang", "cut", "resume"].map((a) => el("button", { type: "button", "data-action": a, title: ACTIONS[a], onclick: act(a) }, a)),
      el("label", {}, "slow ", ms, " ms/msg"),
      el("button", { type: "button", "data-action": "slow", onclick: act("slow", numberOf(ms, "the ms each message takes", "ms")) }, "set"),
      el("label", {}, "fail ", ratio),
      el("button", { type: "button", "data-action": "fail", onclick: act("fail", numberOf(ratio, "the share of messages that fail", "ratio")) }, "set")),
    el("ul", { class: "action-help", "data-role": "action-help" },
      ["kill", "cut", "hang"].map((a) => el("li", {}, el("b", {}, a), ": ", ACTIONS[a]))),
    el("div", { class: "control" },
      el("span", { class: "label" }, "Add"), addMode, CLIENTS.length > 1 ? addClient : null,
      el("button", { type: "button", "data-action": "add-consumer", onclick: (event) =>
        callApi(`/api/groups/${encodeURIComponent(name)}/consumers`, { mode: addMode.value, client: addClient.value },
          event.currentTarget) }, "add consumer")));
}

function setSelect(select, value) {
  // Not while its own request is in flight; afterwards the state (or the error) decides.
  if (!select.dataset.busy && value && select.value !== value) select.value = value;
}

function updateGroupCard(card, g) {
  refreshPreview(card, g);
  // A frame with nothing new for this group (another group's event) costs nothing here.
  const replay = replayOf(g.name);
  const series = lab.lagSeries.get(g.name);
  const stamp = `${g.version}|${lab.topicsVersion}|${replay ? replay.ts : "live"}|${series?.version || 0}`;
  if (card.shownGroup === g && card.shownStamp === stamp) return;
  card.shownGroup = g;
  card.shownStamp = stamp;
  setData(card, "strategy", g.strategy || "");
  setData(card, "mode", g.mode || "");
  setText(card.querySelector(".topic"), g.topic ? `on ${g.topic}` : "");
  setSelect(card.querySelector('[data-control="strategy"]'), g.strategy);
  setSelect(card.querySelector('[data-control="mode"]'), g.mode);
  setText(card.querySelector('[data-role="last-rebalance"]'), lastRebalanceLine(g));
  showNoopRebalances(card.querySelector('[data-role="noop-rebalances"]'), g);
  showHandoffs(card, g);
  setText(card.querySelector('[data-role="route-change"]'), routeChangeLine(g));
  // RocketMQ's answer to an offset that retention deleted: go on from the oldest kept message.
  setText(card.querySelector('[data-role="skipped"]'), g.skipped
    ? `${fmt(g.skipped)} message(s) skipped: retention deleted them before the group consumed them (offsets corrected by the broker)` : "");
  const shownGroup = replay ? replayedGroup(g, replay) : g;
  updateAssignmentView(card, shownGroup, queuesOf(shownGroup, lab.topics[g.topic]), series, movesOf(g.name));
  showLagLines(card, g);
  updateConsumerControls(card, g);
}

function updateConsumerControls(card, g) {
  const who = card.querySelector('select[name="client_id"]');
  if (who) {
    const alive = consumersOf(g).filter((c) => isAlive(g, c));
    const current = [...who.options].map((o) => o.value).join(",");
    if (current !== alive.join(",")) {
      const keep = who.value;
      who.replaceChildren(...alive.map((c) => el("option", { value: c }, c)));
      if (alive.includes(keep)) who.value = keep;
    }
  }
  showConsumerFaults(card, g);
  // "Add" offers the group's own mode; a different pick stays until the group's mode changes.
  const addMode = card.querySelector('select[data-role="add-mode"]');
  if (addMode && addMode.dataset.groupMode !== g.mode) {
    addMode.dataset.groupMode = g.mode;
    addMode.value = g.mode;
  }
}

// The slow and fail inputs show what the picked consumer runs with.
function showConsumerFaults(card, g) {
  const who = card.querySelector('select[name="client_id"]');
  const c = who && g.clients[who.value];
  if (!c) return;
  showInForce(card.querySelector('input[name="ms"]'), c.slow_ms || 0, who.value);
  showInForce(card.querySelector('input[name="ratio"]'), c.fail_ratio || 0, who.value);
}

// Consumers learn of queue and broker changes only from their route refresh (every
// 30 s by default, as RocketMQ's pollNameServerInterval): say how long each one took.
function routeChangeLine(g) {
  const r = g.routeChange;
  if (!r) return "";
  const noticed = Object.entries(r.noticed || {}).map(([cid, ms]) => `${cid} after ${fmtMs(ms)}`);
  const waiting = consumersOf(g).filter((c) => isAlive(g, c) && !(c in (r.noticed || {})));
  return `Route change ${clock(r.ts)} (${r.broker || ""} ${r.change || ""}): noticed by ${noticed.join(", ") || "nobody yet"}` +
    (waiting.length ? ` · not yet: ${waiting.join(", ")}` : "");
}

// The group's no-op rebalances in all; per consumer in the tooltip (and in its row or legend entry).
function showNoopRebalances(node, g) {
  const counts = Object.entries(g.noopRebalances).filter(([, n]) => n > 0).sort(([a], [b]) => javaOrder(a, b));
  const total = counts.reduce((sum, [, n]) => sum + n, 0);
  setData(node, "count", String(total));
  setText(node, total ? `· ${noopText(total)} not shown: they changed nothing (per consumer: hover)` : "");
  setAttr(node, "title", counts.map(([cid, n]) => `${cid}: ${noopText(n)}`).join("\n"));
}
