// The live page: state from the websocket (a snapshot, then one event per frame),
// drawn as one card per consumer group, plus the controls that call the JSON API.
//
// The model is plain data (`lab`); frames update it and ask for a redraw, and redraws
// are throttled so that a flood of events costs one repaint per frame budget.
(() => {
  "use strict";

  const root = document.getElementById("lab");
  const canControl = root.dataset.canControl === "1";
  const STRATEGIES = root.dataset.strategies.split(",");
  const MODES = root.dataset.modes.split(",");
  // action -> one line on what it does (consumers_app/lab/actions.py)
  const ACTIONS = JSON.parse(document.getElementById("consumer-actions").textContent);
  // "ours", then the other RocketMQ clients installed here (ali-ons...), which join over remoting.
  const CLIENTS = JSON.parse(document.getElementById("lab-clients").textContent);
  // RocketMQ's defaults: pullThresholdForQueue, pullThresholdSizeForQueue, consumeConcurrentlyMaxSpan.
  const THRESHOLDS = { cached_count: 1000, cached_mib: 100, span: 2000 };
  const PALETTE = ["#2f6fdf", "#e8871e", "#2ba36b", "#9b4dca", "#d6457a", "#1aa3b5",
                   "#8c6d31", "#5c6bc0", "#7cb342", "#ef6c00", "#00897b", "#6d4c41"];
  const MIB = 1024 * 1024;
  const POP_WINDOW = 24;          // recent pop receptions remembered per queue
  const LOG_LENGTH = 200;
  const FLOW_WINDOW_MS = 10 * 60 * 1000;

  const lab = {
    groups: {},     // name -> group model (see groupFrom)
    topics: {},     // topic -> queue labels
    brokers: {},    // broker -> {online}
    producers: {},  // topic -> {rate, ...}
    flow: [],       // flow_control events, oldest first
    log: [],        // membership / fault / broker / rebalance events, oldest first
    seen: new Set(),  // keys of logged events (snapshots repeat them)
  };
  const colours = new Map();

  // ------------------------------------------------------------------ helpers

  const javaOrder = (a, b) => (a < b ? -1 : a > b ? 1 : 0);  // JS compares UTF-16 code units, as Java does
  function queueOrder(a, b) {
    const [ba, qa] = splitLabel(a), [bb, qb] = splitLabel(b);
    return javaOrder(ba, bb) || qa - qb;
  }
  function splitLabel(label) {
    const i = label.lastIndexOf(":");
    return [label.slice(0, i), Number(label.slice(i + 1))];
  }
  function colourOf(clientId) {
    if (!colours.has(clientId)) colours.set(clientId, PALETTE[colours.size % PALETTE.length]);
    return colours.get(clientId);
  }
  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "style") node.style.cssText = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? "" : v);
    }
    for (const child of children.flat()) {
      if (child !== null && child !== undefined && child !== false) node.append(child);
    }
    return node;
  }
  const fmt = (n, digits = 0) => (n === undefined || n === null ? "–" : Number(n).toLocaleString("en-US", { maximumFractionDigits: digits }));
  function fmtMs(ms) {
    if (ms === undefined || ms === null) return "–";
    if (ms < 1000) return `${Math.round(ms)} ms`;
    if (ms < 120000) return `${(ms / 1000).toFixed(1)} s`;
    return `${Math.round(ms / 60000)} min`;
  }
  const clock = (ts) => new Date(ts).toLocaleTimeString("en-GB", { hour12: false });

  // ------------------------------------------------------------------ model

  function groupFrom(name, snap, previous) {
    const g = {
      name,
      strategy: snap.strategy,
      mode: snap.mode,
      topic: snap.topic,
      observed: !!snap.observed,   // watched on the cluster, not run by the lab: read-only
      clients: snap.clients || {},
      assignments: {},
      queues: {},
      // Per (queue, client) ProcessQueue figures; "*" holds the snapshot's per-queue totals
      // until a consumer reports its own.
      pq: {},
      lastRebalance: snap.last_rebalance || (previous && previous.lastRebalance) || null,
      routeChange: snap.route_change || null,   // the last queue/broker change and who noticed it when
      pops: (previous && previous.pops) || {},   // queue -> recent receivers, newest last
    };
    for (const [cid, labels] of Object.entries(snap.assignments || {})) g.assignments[cid] = [...labels];
    for (const [label, q] of Object.entries(snap.queues || {})) {
      g.queues[label] = { ...q };
      g.pq[label] = { "*": { cached_count: q.cached_count || 0, cached_bytes: q.cached_bytes || 0, span: q.span || 0 } };
    }
    return g;
  }

  function applySnapshot(snap) {
    const groups = {};
    for (const [name, g] of Object.entries(snap.groups || {})) {
      groups[name] = groupFrom(name, g, lab.groups[name]);
      for (const e of g.membership_log || []) logEvent({ ...e, type: e.type || "membership", group: e.group || name });
      for (const e of g.flow_control || []) flowEvent({ ...e, type: "flow_control", group: e.group || name });
    }
    lab.groups = groups;
    if (snap.topics) lab.topics = snap.topics;
    if (snap.brokers) lab.brokers = snap.brokers;
    if (snap.producers) lab.producers = snap.producers;
    if (snap.broker_process) showBrokerProcess(snap.broker_process);
    scheduleRender();
  }

  // runlab restarts a broker that died; while it is down the page says so (and why).
  function showBrokerProcess(bp) {
    const banner = document.getElementById("broker-down");
    if (!banner) return;
    banner.hidden = bp.up !== false;
    if (bp.up === false) {
      const restarts = bp.restarts ? ` (restarted ${bp.restarts} time${bp.restarts === 1 ? "" : "s"} so far)` : "";
      banner.textContent = bp.gave_up
        ? `The broker is down and stays down: ${bp.reason}${restarts}.`
        : `The broker is down: ${bp.reason || "it exited"}; restarting…${restarts}`;
    }
  }

  function queuesOf(g) {
    const labels = new Set(Object.keys(g.queues));
    for (const label of lab.topics[g.topic] || []) labels.add(label);
    if (g.mode !== "pop") {
      for (const list of Object.values(g.assignments)) for (const label of list) if (!label.endsWith(":-1")) labels.add(label);
    }
    return [...labels].sort(queueOrder);
  }

  // Which clients claim `label`. Each consumer rebalances on its own, so while a
  // rebalance is under way two may claim a queue, or none.
  function claimants(g, label) {
    const broker = splitLabel(label)[0];
    return Object.keys(g.assignments).filter((cid) =>
      g.assignments[cid].some((x) => x === label || x === `${broker}:-1`)).sort(javaOrder);
  }

  // Recent receivers of a pop group's queue: its own record, else its broker's (BROKER:-1).
  const popsOf = (g, label) => g.pops[label] || g.pops[`${splitLabel(label)[0]}:-1`] || [];

  function consumersOf(g) {
    const ids = new Set([...Object.keys(g.clients), ...Object.keys(g.assignments)]);
    return [...ids].sort(javaOrder);
  }

  function pqTotals(g, label) {
    const per = g.pq[label] || {};
    const owners = new Set(claimants(g, label));
    const rows = Object.entries(per).filter(([cid]) => cid === "*" || owners.has(cid) || g.mode === "pop").map(([, v]) => v);
    return {
      cached_count: rows.reduce((s, r) => s + (r.cached_count || 0), 0),
      cached_bytes: rows.reduce((s, r) => s + (r.cached_bytes || 0), 0),
      span: rows.reduce((m, r) => Math.max(m, r.span || 0), 0),
    };
  }

  function eventKey(e) {
    return [e.ts, e.type, e.group, e.client_id, e.change || e.fault || e.phase || e.reason || "", e.queue || "", e.broker || ""].join("|");
  }

  const membershipKey = (e) => [e.group, e.change || e.reason, e.members, e.joined, e.left].map(String).join("|");

  function logEvent(e) {
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
    logChanged = true;
  }

  function flowEvent(e) {
    const key = eventKey(e);
    if (lab.seen.has(key)) return;
    lab.seen.add(key);
    lab.flow.push(e);
    lab.flow.sort((a, b) => a.ts - b.ts);
    const horizon = Date.now() - FLOW_WINDOW_MS;
    while (lab.flow.length && (lab.flow[0].ts < horizon || lab.flow.length > 2000)) lab.seen.delete(eventKey(lab.flow.shift()));
    flowChanged = true;
  }

  function applyEvent(e) {
    const g = lab.groups[e.group];
    switch (e.type) {
      case "assignment":
        if (g) {
          g.assignments[e.client_id] = [...(e.queues || [])];
          if (e.strategy) g.strategy = e.strategy;
          if (!g.clients[e.client_id]) g.clients[e.client_id] = { status: "running", mode: g.mode };
        }
        break;
      case "rebalance":
        if (g && (e.phase || "end") === "end") g.lastRebalance = e;
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
        flowEvent(e);
        break;
      case "membership": {
        // The broker reports a change once, and every member again from its own watch:
        // subjects are in joined/left (or client_id when the broker speaks).
        const what = e.change || e.reason;
        const gone = e.left || ((what === "left" || what === "expired") && e.client_id ? [e.client_id] : []);
        if (g) for (const cid of gone) delete g.assignments[cid];
        logEvent(e);
        break;
      }
      case "fault":
        if (g && g.clients[e.client_id]) {
          const c = g.clients[e.client_id];
          if (e.fault === "hang") c.status = "hung";
          else if (e.fault === "cut") c.status = "cut";
          else if (e.fault === "resume") c.status = "running";
          else if (e.fault === "stop") c.status = "stopped";
          else if (e.fault === "kill") c.status = "killed";
          else if (e.fault === "slow") c.slow_ms = e.ms;
          else if (e.fault === "fail") c.fail_ratio = e.ratio;
        }
        logEvent(e);
        break;
      case "broker":
        logEvent(e);
        if (e.topic && e.queues) lab.topics[e.topic] = [...e.queues];
        if (e.broker && "online" in e) lab.brokers[e.broker] = { online: !!e.online };
        if (e.process) showBrokerProcess({ up: e.process === "up", restarts: e.restarts, reason: e.reason });
        break;
      default:
        break;
    }
    scheduleRender();
  }

  // ------------------------------------------------------------------ rendering

  let renderPending = false, logChanged = true, flowChanged = true;
  let chartTimer = null, lastChartDraw = 0;
  const CHART_INTERVAL_MS = 500;   // plotly redraws are the expensive part: at most twice a second

  function scheduleRender() {
    if (renderPending) return;
    renderPending = true;
    requestAnimationFrame(() => {
      renderPending = false;
      render();
    });
  }

  function render() {
    renderGroups();
    if (logChanged) renderLog();
    logChanged = false;
    renderLabControls();
    if (!chartTimer) chartTimer = setTimeout(drawCharts, Math.max(0, CHART_INTERVAL_MS - (performance.now() - lastChartDraw)));
  }

  function drawCharts() {
    chartTimer = null;
    lastChartDraw = performance.now();
    for (const g of Object.values(lab.groups)) drawPqChart(g);
    if (flowChanged) drawFlowChart();
  }

  function renderGroups() {
    const host = document.getElementById("groups");
    const names = Object.keys(lab.groups).sort(javaOrder);
    if (!names.length) return;
    host.querySelector(".empty")?.remove();
    for (const card of host.querySelectorAll(".group")) if (!lab.groups[card.dataset.group]) card.remove();
    for (const name of names) {
      let card = host.querySelector(`.group[data-group="${CSS.escape(name)}"]`);
      if (!card) {
        card = buildGroupCard(name, lab.groups[name].observed);
        host.append(card);
      }
      updateGroupCard(card, lab.groups[name]);
    }
  }

  // Plotly's "responsive" follows the window only; cards also resize when a group comes or goes.
  const resizer = new ResizeObserver((entries) => {
    for (const entry of entries) if (entry.target.data) Plotly.Plots.resize(entry.target);
  });
  resizer.observe(document.getElementById("flow-chart"));

  function buildGroupCard(name, observed) {
    const steer = canControl && !observed;
    const strategySelect = el("select", { name: "strategy", "data-control": "strategy", disabled: !steer, "aria-label": "allocation strategy" },
      STRATEGIES.map((s) => el("option", { value: s }, s)));
    strategySelect.addEventListener("change", () =>
      callApi(`/api/groups/${encodeURIComponent(name)}/strategy`, { strategy: strategySelect.value }, strategySelect));
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
      el("p", { class: "rebalance", "data-role": "last-rebalance" }),
      el("p", { class: "rebalance", "data-role": "route-change" }),
      el("div", { class: "matrix-wrap" }),
      el("div", { class: "pq-chart chart", id: `pq-${name}` }));
    if (steer) card.append(buildConsumerControls(name));
    resizer.observe(card.querySelector(".pq-chart"));
    return card;
  }

  function buildConsumerControls(name) {
    const who = el("select", { name: "client_id", "aria-label": "consumer" });
    const act = (action, body = {}) => (event) => {
      if (!who.value) return showError("Pick a consumer first.");
      callApi(`/api/consumers/${encodeURIComponent(who.value)}/${action}`, body instanceof Function ? body() : body, event.currentTarget);
    };
    const ms = el("input", { type: "number", name: "ms", min: 0, step: 50, value: 200, "aria-label": "ms per message" });
    const ratio = el("input", { type: "number", name: "ratio", min: 0, max: 1, step: 0.05, value: 0.2, "aria-label": "fail ratio" });
    const addMode = el("select", { name: "mode", "aria-label": "mode of the new consumer" }, MODES.map((m) => el("option", { value: m }, m)));
    const addClient = el("select", { name: "client", "aria-label": "which RocketMQ client" }, CLIENTS.map((c) => el("option", { value: c }, c)));
    return el("div", { class: "consumer-controls", "data-role": "consumer-controls" },
      el("div", { class: "control" },
        el("span", { class: "label" }, "Consumer"), who,
        ["stop", "kill", "hang", "cut", "resume"].map((a) => el("button", { type: "button", "data-action": a, title: ACTIONS[a], onclick: act(a) }, a)),
        el("label", {}, "slow ", ms, " ms/msg"),
        el("button", { type: "button", "data-action": "slow", onclick: act("slow", () => ({ ms: Number(ms.value) })) }, "set"),
        el("label", {}, "fail ", ratio),
        el("button", { type: "button", "data-action": "fail", onclick: act("fail", () => ({ ratio: Number(ratio.value) })) }, "set")),
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
    card.dataset.strategy = g.strategy;
    card.dataset.mode = g.mode;
    card.querySelector(".topic").textContent = g.topic ? `on ${g.topic}` : "";
    setSelect(card.querySelector('[data-control="strategy"]'), g.strategy);
    setSelect(card.querySelector('[data-control="mode"]'), g.mode);
    const r = g.lastRebalance;
    card.querySelector('[data-role="last-rebalance"]').textContent = r
      ? `Last rebalance ${clock(r.ts)}${r.client_id ? ` by ${r.client_id}` : ""}: ${r.reason || "periodic"} · ${fmtMs(r.duration_ms)}${changedCount(r) ? ` · ${changedCount(r)} queue(s) changed` : ""}`
      : "No rebalance seen yet.";
    card.querySelector('[data-role="route-change"]').textContent = routeChangeLine(g);
    card.querySelector(".matrix-wrap").replaceChildren(matrix(g));
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

  const changedCount = (r) => (r.changed || []).length + (r.added || []).length + (r.removed || []).length;
  const isAlive = (g, cid) => !["stopped", "killed", "crashed", "left", "gone"].includes((g.clients[cid] || {}).status);

  // The assignment matrix: consumers × queues, a cell filled in its consumer's colour
  // when that consumer claims the queue (push, lite-pull) or recently received from it (pop).
  function matrix(g) {
    const queues = queuesOf(g);
    const consumers = consumersOf(g);
    const pop = g.mode === "pop";
    const head = el("tr", {}, el("th", { class: "corner" }, pop ? "received by" : "owned by"),
      queues.map((label) => {
        const owners = pop ? [...new Set(popsOf(g, label))].sort(javaOrder) : claimants(g, label);
        const latest = pop ? popsOf(g, label).at(-1) : owners[0];
        const state = pop ? (owners.length ? "received" : "idle") : owners.length === 1 ? "owned" : owners.length ? "contested" : "unowned";
        const note = pop ? (owners.length > 2 ? `${owners.length} consumers` : owners.join(", ") || "no pops")
          : state === "owned" ? owners[0] : state === "contested" ? `${owners.length} owners` : "unowned";
        return el("th", {
          class: `queue-head ${state}`, scope: "col", "data-queue": label, "data-state": state,
          "data-owner": state === "owned" || pop ? latest || "" : "", "data-owners": owners.join(","),
          title: pop ? `recent messages of ${label} went to ${owners.join(", ") || "nobody yet"}` : `${label}: ${owners.join(", ") || "no owner"}`,
        }, el("span", { class: "qlabel" }, label), el("span", { class: "qnote" }, note));
      }));
    const rows = consumers.map((cid) => {
      const c = g.clients[cid] || {};
      const status = c.status || "running";
      const faults = [c.slow_ms ? `slow ${c.slow_ms} ms` : "", c.fail_ratio ? `fail ${Math.round(c.fail_ratio * 100)}%` : ""].filter(Boolean).join(" · ");
      return el("tr", { "data-consumer": cid, "data-status": status, class: isAlive(g, cid) ? "" : "dead" },
        el("th", { scope: "row", class: "consumer", title: cid },
          el("span", { class: "swatch", style: `background:${colourOf(cid)}` }), el("span", { class: "cid" }, cid),
          status !== "running" ? el("span", { class: `status ${status}` }, status) : null,
          c.client === "outside" ? el("span", { class: "peer", "data-role": "outside-client",
            title: c.assignment_source === "unknown" ? `${c.note}: its queues are unknown; lag comes from the broker's stats`
              : "its queues are what it reports holding (GET_CONSUMER_RUNNING_INFO)" },
            `${c.language || "?"} ${c.version || ""}`.trim() + (c.assignment_source === "unknown" ? " · no running info" : ""))
          : c.client && c.client !== "ours" ? el("span", { class: "peer", "data-role": "peer-client",
            title: c.assignment_source === "broker" ? `${c.client}: its queues are what the broker sees it pull`
              : `${c.client}: its queues are what it reports holding (GET_CONSUMER_RUNNING_INFO)` },
            c.assignment_source === "broker" ? `${c.client} · seen by the broker` : c.client) : null,
          faults ? el("span", { class: "faults" }, faults) : null),
        queues.map((label) => {
          if (pop) {
            const n = popsOf(g, label).filter((x) => x === cid).length;
            const alpha = n ? 0.25 + 0.75 * (n / POP_WINDOW) : 0;
            return el("td", { class: "cell", "data-queue": label, "data-consumer": cid, "data-received": n,
              style: n ? `background:${colourOf(cid)};opacity:${alpha.toFixed(2)}` : "" }, n ? String(n) : "");
          }
          const owns = (g.assignments[cid] || []).includes(label);
          return el("td", { class: `cell${owns ? " owns" : ""}`, "data-queue": label, "data-consumer": cid,
            style: owns ? `background:${colourOf(cid)}` : "" });
        }));
    });
    const metric = (title, value, limit) => el("tr", { class: "metric" }, el("th", { scope: "row" }, title),
      queues.map((label) => {
        const v = value(label);
        const hot = limit !== undefined && v >= limit;
        return el("td", { class: hot ? "hot" : "", "data-queue": label }, v === null ? "–" : fmt(v, title === "cached MiB" ? 1 : 0));
      }));
    const foot = [
      metric("cached msgs", (l) => pqTotals(g, l).cached_count, THRESHOLDS.cached_count),
      metric("cached MiB", (l) => pqTotals(g, l).cached_bytes / MIB, THRESHOLDS.cached_mib),
      metric("span", (l) => pqTotals(g, l).span, THRESHOLDS.span),
      metric("lag", (l) => (g.queues[l] ? g.queues[l].lag : null)),
      el("tr", { class: "metric" }, el("th", { scope: "row" }, "time lag"),
        queues.map((l) => el("td", { "data-queue": l }, g.queues[l] ? fmtMs(g.queues[l].time_lag_ms) : "–"))),
    ];
    return el("table", { class: `matrix${pop ? " pop" : ""}`, "data-group": g.name },
      el("thead", {}, head), el("tbody", {}, rows), el("tfoot", {}, foot));
  }

  // ProcessQueue depth per queue against RocketMQ's flow-control thresholds.
  function drawPqChart(g) {
    const div = document.getElementById(`pq-${g.name}`);
    if (!div || !window.Plotly) return;
    const queues = queuesOf(g);
    const totals = queues.map((l) => pqTotals(g, l));
    const owner = queues.map((l) => claimants(g, l));
    const colour = owner.map((o) => (o.length === 1 ? colourOf(o[0]) : o.length ? "#d33" : "#bbb"));
    const panels = [
      ["cached messages", totals.map((t) => t.cached_count), THRESHOLDS.cached_count],
      ["cached MiB", totals.map((t) => t.cached_bytes / MIB), THRESHOLDS.cached_mib],
      ["span (max − min offset)", totals.map((t) => t.span), THRESHOLDS.span],
    ];
    const data = panels.map(([name, y], i) => ({
      type: "bar", x: queues, y, name, xaxis: `x${i + 1}`, yaxis: `y${i + 1}`, marker: { color: colour },
      hovertemplate: `%{x}: %{y}<extra>${name}</extra>`,
    }));
    const layout = {
      height: 190, margin: { l: 44, r: 10, t: 26, b: 54 }, showlegend: false, bargap: 0.25,
      grid: { rows: 1, columns: 3, pattern: "independent", xgap: 0.12 },
      font: { size: 11 }, paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "#fff",
      annotations: panels.map(([name], i) => ({ text: name, xref: `x${i + 1} domain`, yref: `y${i + 1} domain`, x: 0, y: 1.16, showarrow: false, xanchor: "left", font: { size: 11, color: "#555" } })),
      shapes: panels.map(([, , limit], i) => ({
        type: "line", xref: `x${i + 1} domain`, x0: 0, x1: 1, yref: `y${i + 1}`, y0: limit, y1: limit,
        line: { color: "#d33", width: 1.5, dash: "dash" },
      })),
    };
    panels.forEach(([, y, limit], i) => {
      layout[`yaxis${i + 1}`] = { range: [0, Math.max(limit * 1.1, ...y) ], rangemode: "tozero", gridcolor: "#eee" };
      layout[`xaxis${i + 1}`] = { tickangle: -45, type: "category" };
    });
    Plotly.react(div, data, layout, { displayModeBar: false, responsive: true });
  }

  const FLOW_COLOURS = { count: "#e8871e", size: "#9b4dca", span: "#d6457a", all: "#2f6fdf" };

  function drawFlowChart() {
    flowChanged = false;
    const div = document.getElementById("flow-chart");
    const counter = document.getElementById("flow-count");
    counter.dataset.count = String(lab.flow.length);
    counter.textContent = `${lab.flow.length} event${lab.flow.length === 1 ? "" : "s"} in the last ${FLOW_WINDOW_MS / 60000} min`;
    if (!window.Plotly) return;
    const reasons = [...new Set(lab.flow.map((e) => e.reason || "?"))].sort();
    const data = reasons.map((reason) => {
      const events = lab.flow.filter((e) => (e.reason || "?") === reason);
      return {
        type: "scatter", mode: "markers", name: reason,
        x: events.map((e) => new Date(e.ts)),
        y: events.map((e) => `${e.group} ${e.client_id}`),
        text: events.map((e) => `${e.queue || ""} ${reason}: ${fmt(e.value)} ≥ ${fmt(e.threshold)}`),
        hovertemplate: "%{y}<br>%{text}<extra></extra>",
        marker: { color: FLOW_COLOURS[reason] || "#666", size: 8, symbol: "line-ns-open", line: { width: 2 } },
      };
    });
    Plotly.react(div, data, {
      height: 220, margin: { l: 110, r: 10, t: 10, b: 30 }, font: { size: 11 },
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "#fff", legend: { orientation: "h", y: -0.2 },
      // At least the last minute, so a burst of events does not fill the whole axis.
      xaxis: { type: "date", gridcolor: "#eee",
               range: [new Date(Math.min(lab.flow.length ? lab.flow[0].ts : Infinity, Date.now() - 60_000)), new Date(Date.now() + 2_000)] }, yaxis: { type: "category", automargin: true },
      annotations: lab.flow.length ? [] : [{ text: "no flow control so far", showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5, font: { color: "#888" } }],
    }, { displayModeBar: false, responsive: true });
  }

  function describe(e) {
    switch (e.type) {
      case "membership": {
        const what = e.change || e.reason || "changed";
        const who = (what === "joined" && e.joined && e.joined.length ? e.joined : (e.left && e.left.length ? e.left : [e.client_id])).filter(Boolean).join(", ");
        const members = e.members ? ` · members: ${e.members.join(", ") || "none"}` : "";
        return what === "initial" ? `watching${members}` : `${who || "group"} ${what}${members}`;
      }
      case "fault": {
        const detail = [e.ms !== undefined ? `${e.ms} ms` : "", e.ratio !== undefined ? `ratio ${e.ratio}` : "",
          e.rate !== undefined ? `${e.rate} msg/s` : "", e.count !== undefined ? `×${e.count}` : "",
          e.strategy ? e.strategy : ""].filter(Boolean).join(" ");
        return `${e.client_id || e.topic || ""} ${e.fault}${detail ? ` ${detail}` : ""}`;
      }
      case "broker":
        if (e.process) return `broker process ${e.process}${e.reason ? `: ${e.reason}` : ""}${e.restarts ? ` (restarts: ${e.restarts})` : ""}`;
        return `broker ${e.broker || ""} ${e.change || (e.online ? "online" : "offline")}${e.delta ? ` ${e.delta > 0 ? "+" : ""}${e.delta} queue(s)` : ""}`;
      default: return e.type;
    }
  }

  function renderLog() {
    const list = document.getElementById("membership-log");
    list.replaceChildren(...lab.log.slice().reverse().map((e) => el("li", { class: `log-${e.type}`, "data-type": e.type, "data-client": e.client_id || "" },
      el("time", {}, clock(e.ts)), " ", el("span", { class: "log-group" }, e.group || "lab"), " ", describe(e))));
  }

  function renderLabControls() {
    if (!canControl) return;
    const topics = Object.keys(lab.topics).sort(javaOrder);
    for (const select of document.querySelectorAll(".topic-select")) {
      const values = [...select.options].map((o) => o.value).join(",");
      if (values !== topics.join(",")) {
        const keep = select.value;
        select.replaceChildren(...topics.map((t) => el("option", { value: t }, t)));
        if (topics.includes(keep)) select.value = keep;
      }
    }
    const brokerNames = Object.keys(lab.brokers).sort(javaOrder);
    const brokerSelect = document.querySelector(".broker-select");
    if ([...brokerSelect.options].slice(1).map((o) => o.value).join(",") !== brokerNames.join(",")) {
      const keep = brokerSelect.value;
      brokerSelect.replaceChildren(el("option", { value: "" }, "first broker"), ...brokerNames.map((b) => el("option", { value: b }, b)));
      brokerSelect.value = brokerNames.includes(keep) ? keep : "";
    }
    const host = document.getElementById("brokers");
    host.replaceChildren(el("span", { class: "label" }, "Brokers"), ...brokerNames.map((b) => {
      const online = lab.brokers[b].online !== false;
      return el("span", { class: `broker ${online ? "online" : "offline"}`, "data-broker": b, "data-online": online ? "1" : "0" },
        el("span", { class: "dot" }), b, " ",
        el("button", { type: "button", "data-action": online ? "offline" : "online",
          onclick: (event) => callApi(`/api/brokers/${encodeURIComponent(b)}/${online ? "offline" : "online"}`, {}, event.currentTarget) },
        online ? "take offline" : "bring online"));
    }));
    const topic = document.querySelector("#producer-form .topic-select").value;
    const producer = lab.producers[topic];
    document.getElementById("producer-rate").textContent = producer && producer.rate !== undefined ? `now ${fmt(producer.rate)} msg/s` : "";
  }

  // ------------------------------------------------------------------ API calls

  const csrfToken = document.querySelector('meta[name="csrf-token"]')?.content || "";

  async function callApi(url, body, control) {
    if (control) {
      control.disabled = true;
      control.dataset.busy = "1";
    }
    try {
      const response = await fetch(url, {
        method: "POST", credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-CSRFToken": csrfToken },
        body: JSON.stringify(body),
      });
      const data = await response.json().catch(() => ({ error: `${response.status} ${response.statusText}` }));
      if (!response.ok) {
        showError(data.error || `${response.status} ${response.statusText}`);
        scheduleRender();
        return null;
      }
      hideError();
      applySnapshot(data.state || data);   // every action answers with the new state
      return data;
    } catch (err) {
      showError(`Request failed: ${err.message}`);
      return null;
    } finally {
      if (control) {
        control.disabled = false;
        delete control.dataset.busy;
      }
      scheduleRender();
    }
  }

  const errorBox = document.getElementById("lab-error");
  function showError(message) {
    errorBox.querySelector(".message").textContent = message;
    errorBox.hidden = false;
  }
  function hideError() { errorBox.hidden = true; }
  errorBox.querySelector(".dismiss").addEventListener("click", hideError);

  if (canControl) {
    const producerForm = document.getElementById("producer-form");
    producerForm.addEventListener("submit", (event) => {
      event.preventDefault();
      const f = new FormData(producerForm);
      if (event.submitter.dataset.api === "burst") {
        callApi("/api/producers/burst", { topic: f.get("topic"), count: Number(f.get("count")) }, event.submitter);
      } else {
        callApi("/api/producers/rate", { topic: f.get("topic"), rate: Number(f.get("rate")) }, event.submitter);
      }
    });
    const queuesForm = document.getElementById("queues-form");
    queuesForm.addEventListener("submit", (event) => {
      event.preventDefault();
      const f = new FormData(queuesForm);
      const body = { delta: Number(event.submitter.dataset.delta) };
      if (f.get("broker")) body.broker = f.get("broker");
      callApi(`/api/topics/${encodeURIComponent(f.get("topic"))}/queues`, body, event.submitter);
    });
    const groupForm = document.getElementById("group-form");
    groupForm.addEventListener("submit", (event) => {
      event.preventDefault();
      const f = new FormData(groupForm);
      callApi(`/api/groups/${encodeURIComponent(f.get("group").trim())}/consumers`,
        { mode: f.get("mode"), client: f.get("client") || "ours" }, event.submitter);
    });
    const observeForm = document.getElementById("observe-form");
    observeForm.addEventListener("submit", (event) => {
      event.preventDefault();
      callApi("/api/observe", { group: new FormData(observeForm).get("group").trim() }, event.submitter);
    });
  }

  // ------------------------------------------------------------------ websocket

  const status = document.getElementById("ws-status");
  let received = 0, acked = 0, retryMs = 500;

  function setStatus(state, text) {
    status.dataset.state = state;
    status.textContent = text;
  }

  function connect() {
    const ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws/lab/`);
    received = acked = 0;
    // Tell the server how far we got, so a page that cannot keep up gets a fresh
    // snapshot instead of an ever-growing backlog (see dashboard/consumers.py).
    const acker = setInterval(() => {
      if (ws.readyState === WebSocket.OPEN && received !== acked) {
        acked = received;
        ws.send(JSON.stringify({ type: "ack", received }));
      }
    }, 250);
    ws.onopen = () => { retryMs = 500; setStatus("live", "live"); };
    ws.onmessage = (message) => {
      received += 1;
      const frame = JSON.parse(message.data);
      if (frame.type === "snapshot") applySnapshot(frame);
      else applyEvent(frame);
    };
    ws.onclose = (event) => {
      clearInterval(acker);
      setStatus("down", event.code === 4503 ? "lab unavailable, retrying…" : "disconnected, retrying…");
      setTimeout(connect, retryMs);
      retryMs = Math.min(retryMs * 2, 10000);
    };
  }

  connect();
})();
