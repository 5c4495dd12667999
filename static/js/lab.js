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
    cluster: { attached: false },   // runlab --namesrv: {attached, namesrv, disabled: {control: why}}
    flow: [],       // flow_control events, oldest first
    log: [],        // membership / fault / broker events, oldest first
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
  // A consumer's colour follows from its id alone, so it keeps it for its life whoever comes
  // and goes (and after a reload): the lab's cN is the palette's Nth; past the palette, and
  // for other clients' ids (a hash), hues spread by the golden angle (two lightnesses), so
  // that 64 or 128 consumers still get colours of their own rather than the palette's again.
  function colourNumber(clientId) {
    const lab = /^c(\d+)$/.exec(clientId);
    if (lab) return Number(lab[1]) - 1;
    let hash = 0;
    for (const ch of clientId) hash = (hash * 31 + ch.codePointAt(0)) >>> 0;
    return PALETTE.length + (hash % 4093);
  }
  function colourOf(clientId) {
    if (!colours.has(clientId)) {
      const n = colourNumber(String(clientId));
      colours.set(clientId, n < PALETTE.length ? PALETTE[n]
        : `hsl(${Math.round((n * 137.508) % 360)} ${n % 2 ? 55 : 70}% ${n % 3 ? 45 : 60}%)`);
    }
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
  // A time lag the cluster has not told yet is null: "unknown", never a 0 that says caught up.
  function fmtTimeLag(ms) {
    return ms === null ? "unknown" : fmtMs(ms);
  }
  // Locale formatting is slow enough to show in a frame's profile: remember what it gave.
  const clockTexts = new Map();
  function clock(ts) {
    if (!clockTexts.has(ts)) {
      if (clockTexts.size >= 1000) clockTexts.clear();
      clockTexts.set(ts, new Date(ts).toLocaleTimeString("en-GB", { hour12: false }));
    }
    return clockTexts.get(ts);
  }

  // ------------------------------------------------------------------ model

  function groupFrom(name, snap, previous) {
    const g = {
      name,
      version: 0,
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

  function applySnapshot(snap) {
    const groups = {};
    for (const [name, g] of Object.entries(snap.groups || {})) {
      groups[name] = groupFrom(name, g, lab.groups[name]);
      for (const e of g.membership_log || []) logEvent({ ...e, type: e.type || "membership", group: e.group || name });
      for (const e of g.flow_control || []) flowEvent({ ...e, type: "flow_control", group: e.group || name });
    }
    lab.groups = groups;
    for (const [name, g] of Object.entries(groups)) appendLag(name, g);
    if (snap.topics) {
      lab.topics = snap.topics;
      topicsVersion += 1;
    }
    if (snap.brokers) lab.brokers = snap.brokers;
    if (snap.producers) lab.producers = snap.producers;
    if (snap.broker_process) showBrokerProcess(snap.broker_process);
    if (snap.cluster) showCluster(snap.cluster);
    if (snap.disk) showDiskUse(snap.disk);
    showHistoryService(snap.history_service);
    scheduleRender();
  }

  // Bytes on disk per part, as the controller measures them every 10 s; a part the lab
  // cannot see (someone else's broker) is not in the snapshot and not on the line.
  const DISK_PARTS = [["commitlog", "commit log"], ["consumequeue", "consume queues"], ["recordings", "recordings"],
                      ["lag_history", "history"], ["database", "db"]];
  function showDiskUse(disk) {
    const line = document.getElementById("disk-use");
    const mib = (bytes) => (bytes > 0 && bytes < MIB ? "< 1 MiB" : `${Math.round(bytes / MIB)} MiB`);
    const parts = DISK_PARTS.filter(([key]) => key in disk).map(([key, name]) => {
      const budget = disk.budget && disk.budget[key];
      return `${name} ${mib(disk[key])}${budget ? ` of ${Math.round(budget / MIB)}` : ""}`;
    });
    const text = parts.length ? `disk: ${parts.join(" · ")}` : "";
    setText(line, text);
    if (line.hidden !== !text) line.hidden = !text;
  }

  // What keeping the lag history fresh costs, beside the disk line ("history: 3 % CPU, 6 s behind").
  function showHistoryService(service) {
    const line = document.getElementById("history-cost");
    if (!line) return;
    let text = "";
    if (service && service.state === "running") {
      const cpu = service.cpu_pct == null ? "measuring CPU" : `${Math.round(service.cpu_pct)} % CPU`;
      const behind = service.behind_s == null ? "nothing folded yet" : `${Math.round(service.behind_s)} s behind`;
      text = `history: ${cpu}, ${behind}`;
    } else if (service && service.state === "paused") {
      text = `history: paused (${service.paused || "see the history page"})`;
    }
    setText(line, text);
    if (line.hidden !== !text) line.hidden = !text;
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

  // On someone else's cluster some lab controls cannot work: they stay on the page,
  // disabled, with the reason as their title, and the reasons are listed once in words.
  const disabledReason = (control) => (lab.cluster.disabled || {})[control] || "";

  function showCluster(cluster) {
    lab.cluster = cluster;
    const note = document.getElementById("cluster-note");
    if (note) {
      note.hidden = !cluster.attached;
      const reasons = Object.values(cluster.disabled || {});
      setText(note, cluster.attached
        ? `Attached to the cluster at ${cluster.namesrv}.${reasons.length ? ` Disabled: ${reasons.join("; ")}.` : ""}` : "");
    }
    disableClusterControls(document);
  }

  function disableClusterControls(root) {
    const pop = disabledReason("pop");
    for (const option of root.querySelectorAll('select[name="mode"] option[value="pop"]')) {
      option.disabled = !!pop;
      option.title = pop;
      if (pop && option.selected) option.parentElement.value = "push";
    }
    for (const button of root.querySelectorAll("#queues-form button")) {
      button.disabled = !!disabledReason("queues");
      button.title = disabledReason("queues");
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

  // Which clients claim each queue: label -> client ids, sorted. Each consumer rebalances
  // on its own, so while a rebalance is under way two may claim a queue, or none.
  // One pass over the assignments (a pop client's BROKER:-1 stands for each queue of BROKER):
  // asking per queue would cost queues × consumers at 1024 × 128.
  function ownerIndex(g, queues) {
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
  const popsOf = (g, label) => g.pops[label] || g.pops[`${splitLabel(label)[0]}:-1`] || [];

  function consumersOf(g) {
    const ids = new Set([...Object.keys(g.clients), ...Object.keys(g.assignments)]);
    return [...ids].sort(javaOrder);
  }

  // A queue's ProcessQueue figures: the snapshot's totals, or what its holders report.
  function pqTotals(g, label, holders) {
    const per = g.pq[label] || {};
    const rows = Object.entries(per).filter(([cid]) => cid === "*" || holders.includes(cid) || g.mode === "pop").map(([, v]) => v);
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
    if (g) g.version += 1;   // its views compare this to skip groups nothing happened to
    switch (e.type) {
      case "assignment":
        if (g) {
          g.assignments[e.client_id] = [...(e.queues || [])];
          if (e.strategy) g.strategy = e.strategy;
          if (!g.clients[e.client_id]) g.clients[e.client_id] = { status: "running", mode: g.mode };
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
        flowEvent(e);
        break;
      case "membership": {
        // The broker reports a change once, and every member again from its own watch:
        // subjects are in joined/left (or client_id when the broker speaks).
        const what = e.change || e.reason;
        const gone = e.left || (["left", "expired", "closed"].includes(what) && e.client_id ? [e.client_id] : []);
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
      case "offset_moved":
        // The count comes with the next snapshot (a second away); counting events too would
        // count twice the ones a snapshot already holds.
        if (e.skipped) logEvent(e);   // a correction backwards skips nothing: not worth a line
        break;
      case "broker":
        logEvent(e);
        if (e.topic && e.queues) {
          lab.topics[e.topic] = [...e.queues];
          topicsVersion += 1;
        }
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
  let topicsVersion = 0;       // bumped when lab.topics changes: every group's queues may have
  const views = new Map();     // group name -> its assignment view (MatrixView | GridView)
  let chartTimer = null, lastChartDraw = 0, lastChartCost = 0;
  // Plotly redraws are the expensive part (tens of ms each, more on a busy machine): at most
  // twice a second, and spaced so that they take at most a ninth of the main thread.
  const CHART_INTERVAL_MS = 500, CHART_SHARE = 1 / 9;

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
    const interval = Math.max(CHART_INTERVAL_MS, lastChartCost / CHART_SHARE);
    if (!chartTimer) chartTimer = setTimeout(drawCharts, Math.max(0, interval - (performance.now() - lastChartDraw)));
  }

  function drawCharts() {
    chartTimer = null;
    const started = performance.now();
    for (const g of Object.values(lab.groups)) drawPqChart(g);
    if (flowChanged) drawFlowChart();
    lastChartDraw = performance.now();
    lastChartCost = lastChartDraw - started;
  }

  function renderGroups() {
    const host = document.getElementById("groups");
    const names = Object.keys(lab.groups).sort(javaOrder);
    if (!names.length) return;
    host.querySelector(".empty")?.remove();
    for (const card of host.querySelectorAll(".group")) {
      if (!lab.groups[card.dataset.group]) {
        views.delete(card.dataset.group);
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

  // Plotly's "responsive" follows the window only; cards also resize when a group comes or goes.
  const resizer = new ResizeObserver((entries) => {
    for (const entry of entries) if (entry.target.data) Plotly.Plots.resize(entry.target);
  });
  resizer.observe(document.getElementById("flow-chart"));

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
    resizer.observe(card.querySelector(".pq-chart"));
    return card;
  }

  function buildConsumerControls(name) {
    const who = el("select", { name: "client_id", "aria-label": "consumer" });
    who.addEventListener("change", () => {
      const card = who.closest(".group");
      if (card && lab.groups[name]) showConsumerFaults(card, lab.groups[name]);
    });
    const act = (action, body = {}) => (event) => {
      if (!who.value) return showError("Pick a consumer first.", event.currentTarget);
      callApi(`/api/consumers/${encodeURIComponent(who.value)}/${action}`, body instanceof Function ? body() : body, event.currentTarget);
    };
    const ms = el("input", { type: "number", name: "ms", min: 0, step: 50, value: 200, "aria-label": "ms per message" });
    const ratio = el("input", { type: "number", name: "ratio", min: 0, max: 1, step: 0.05, value: 0.2, "aria-label": "fail ratio" });
    // Follows the group's mode (updateConsumerControls): a group takes only consumers of its own mode.
    const addMode = el("select", { name: "mode", "data-role": "add-mode", "aria-label": "mode of the new consumer" }, MODES.map((m) => el("option", { value: m }, m)));
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

  // Writers that touch the DOM only when the value differs: the views call them every frame,
  // and an unchanged cell must cost no style recalculation (nor a mutation record).
  function setData(node, key, value) { if (node.dataset[key] !== value) node.dataset[key] = value; }
  function setText(node, text) { if (node.textContent !== text) node.textContent = text; }
  function setAttr(node, name, value) { if (node.getAttribute(name) !== value) node.setAttribute(name, value); }
  function setClassName(node, value) { if (node.className !== value) node.className = value; }
  function setClass(node, name, on) { if (node.classList.contains(name) !== on) node.classList.toggle(name, on); }
  // An attribute, not a class: the views rewrite their cells' className as they paint.
  function setMark(node, on) { if (node.hasAttribute("data-would-move") !== on) node.toggleAttribute("data-would-move", on); }
  function setStyle(node, css) {
    // The browser rewrites cssText in its own form, so compare with what we wrote last.
    if (node.writtenStyle === css) return;
    node.writtenStyle = css;
    node.style.cssText = css;
  }

  function updateGroupCard(card, g) {
    refreshPreview(card, g);
    // A frame with nothing new for this group (another group's event) costs nothing here.
    const replay = replays.get(g.name);
    const stamp = `${g.version}|${topicsVersion}|${replay ? replay.ts : "live"}|${lagSeries.get(g.name)?.version || 0}`;
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
    updateAssignmentView(card, replay ? replayedGroup(g, replay) : g);
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

  // An input shows the value in force: set again whenever that value changes (or the thing
  // it is about does), and left alone while the user types a new one.
  function showInForce(input, value, about) {
    if (!input || value === undefined || value === null) return;
    const stamp = `${about}|${value}`;
    if (input.dataset.inForce === stamp || document.activeElement === input) return;
    input.dataset.inForce = stamp;
    input.value = String(value);
  }

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

  const noopText = (n) => `${n} no-op rebalance${n === 1 ? "" : "s"}`;

  // The group's no-op rebalances in all; per consumer in the tooltip (and in its row or legend entry).
  function showNoopRebalances(node, g) {
    const counts = Object.entries(g.noopRebalances).filter(([, n]) => n > 0).sort(([a], [b]) => javaOrder(a, b));
    const total = counts.reduce((sum, [, n]) => sum + n, 0);
    setData(node, "count", String(total));
    setText(node, total ? `· ${noopText(total)} not shown: they changed nothing (per consumer: hover)` : "");
    setAttr(node, "title", counts.map(([cid, n]) => `${cid}: ${noopText(n)}`).join("\n"));
  }

  const changedCount = (r) => (r.changed || []).length + (r.added || []).length + (r.removed || []).length;
  const isAlive = (g, cid) => !["stopped", "killed", "crashed", "left", "expired", "closed", "gone"].includes((g.clients[cid] || {}).status);

  // ------------------------------------------------------------------ assignment views
  //
  // Each group card holds one assignment view: the element [data-assignment-group=G] with
  // one [data-queue] element per queue carrying data-owners and data-state. Views are keyed
  // DOM: a queue's elements are built once and afterwards only the attributes that changed
  // are written, so a frame costs what changed, not the size of the group.

  // Up to this size the detailed matrix (a row per consumer, figures per queue) stays
  // readable; above it each queue is one small cell of a dense grid.
  const MATRIX_MAX_QUEUES = 16, MATRIX_MAX_CONSUMERS = 12;

  function updateAssignmentView(card, g) {
    const queues = queuesOf(g);
    const consumers = consumersOf(g);
    const Kind = queues.length > MATRIX_MAX_QUEUES || consumers.length > MATRIX_MAX_CONSUMERS ? GridView : MatrixView;
    let view = views.get(g.name);
    if (!(view instanceof Kind)) {
      view = new Kind(g.name);
      views.set(g.name, view);
      card.querySelector(".matrix-wrap").replaceChildren(view.root);
    }
    view.update(g, queues, consumers, ownerIndex(g, queues));
    const moves = previews.get(g.name)?.moves || NO_MOVES;
    if (moves.size || view.marked) view.markMoves(moves);   // nothing to write without a preview
  }

  // What a view shows of one queue. Push and lite pull: who claims it ("owned"; "contested"
  // or "unowned" while a rebalance is under way). Pop shares queues by design: who recently
  // received its messages ("received" or "idle"), the latest of them as `owner`.
  function queueFacts(g, label, holders) {
    if (g.mode === "pop") {
      const recent = popsOf(g, label);
      const owners = [...new Set(recent)].sort(javaOrder);
      return { owners, state: owners.length ? "received" : "idle", owner: recent.at(-1) || "" };
    }
    const state = holders.length === 1 ? "owned" : holders.length ? "contested" : "unowned";
    return { owners: holders, state, owner: state === "owned" ? holders[0] : "" };
  }

  const isHot = (t) => t.cached_count >= THRESHOLDS.cached_count || t.cached_bytes / MIB >= THRESHOLDS.cached_mib || t.span >= THRESHOLDS.span;

  // One queue in words, for the grid's tooltip.
  function queueDetails(g, label, facts, totals) {
    const q = g.queues[label] || {};
    const who = g.mode === "pop" ? `received by ${facts.owners.join(", ") || "nobody recently"}`
      : facts.state === "owned" ? `owned by ${facts.owner}`
        : facts.state === "contested" ? `${facts.owners.length} owners: ${facts.owners.join(", ")}` : "unowned";
    return [label, who, `lag ${fmt(q.lag)} · time lag ${fmtTimeLag(q.time_lag_ms)}`,
      `cached ${fmt(totals.cached_count)} msgs · ${fmt(totals.cached_bytes / MIB, 1)} MiB · span ${fmt(totals.span)}`];
  }

  // A long client id (a peer's 192.0.2.2@ali-ons-13877) shortened to its ends, the whole on
  // hover: the matrix stays inside its card.
  const CID_MAX = 14;
  const shortCid = (cid) => (cid.length > CID_MAX ? `${cid.slice(0, 6)}…${cid.slice(-6)}` : cid);
  function cidLabel(cid) {
    const short = shortCid(cid);
    return el("span", { class: "cid", title: short === cid ? null : cid, "data-cid": cid }, short);
  }

  // A consumer's row head in the matrix: swatch, id, status, faults, which client it is.
  function consumerLabel(cid, c, status) {
    const faults = [c.slow_ms ? `slow ${c.slow_ms} ms` : "", c.fail_ratio ? `fail ${Math.round(c.fail_ratio * 100)}%` : ""].filter(Boolean).join(" · ");
    return [
      el("span", { class: "swatch", style: `background:${colourOf(cid)}` }), cidLabel(cid),
      status !== "running" ? el("span", { class: `status ${status}` }, status) : null,
      c.client === "outside" ? el("span", { class: "peer", "data-role": "outside-client",
        title: c.assignment_source === "unknown" ? `${c.note}: its queues are unknown; lag comes from the broker's stats`
          : "its queues are what it reports holding (GET_CONSUMER_RUNNING_INFO)" },
        `${c.language || "?"} ${c.version || ""}`.trim() + (c.assignment_source === "unknown" ? " · no running info" : ""))
      : c.client && c.client !== "ours" ? el("span", { class: "peer", "data-role": "peer-client",
        title: c.assignment_source === "broker" ? `${c.client}: its queues are what the broker sees it pull`
          : `${c.client}: its queues are what it reports holding (GET_CONSUMER_RUNNING_INFO)` },
        c.assignment_source === "broker" ? `${c.client} · seen by the broker` : c.client) : null,
      faults ? el("span", { class: "faults" }, faults) : null,
    ].filter(Boolean);
  }

  // The matrix's figure rows: title, then (totals, broker figures) -> [text, over a threshold].
  const METRICS = [
    ["cached msgs", (t) => [fmt(t.cached_count), t.cached_count >= THRESHOLDS.cached_count]],
    ["cached MiB", (t) => [fmt(t.cached_bytes / MIB, 1), t.cached_bytes / MIB >= THRESHOLDS.cached_mib]],
    ["span", (t) => [fmt(t.span), t.span >= THRESHOLDS.span]],
    ["lag", (t, q) => [q ? fmt(q.lag) : "–", false]],
    ["time lag", (t, q) => [q ? fmtTimeLag(q.time_lag_ms) : "–", false]],
  ];
  const TREND = "lag, 5 min";

  // Small groups: consumers × queues, a cell filled in its consumer's colour when that
  // consumer claims the queue (push, lite-pull) or recently received from it (pop), and
  // each queue's figures below. The table is built once per (mode, queues, consumers) and
  // updated in place; its queue heads are the [data-queue] elements.
  class MatrixView {
    constructor(name) {
      this.root = el("table", { class: "matrix", "data-assignment-group": name });
      this.shape = "";
    }

    update(g, queues, consumers, holders) {
      const pop = g.mode === "pop";
      const shape = [g.mode, queues.join(" "), consumers.join(" ")].join("|");
      if (shape !== this.shape) {
        this.shape = shape;
        this.build(pop, queues, consumers);
      }
      for (const cid of consumers) this.paintConsumer(g, cid);
      for (const label of queues) {
        const held = holders.get(label);
        this.paintHead(this.heads.get(label), label, queueFacts(g, label, held), pop);
        for (const cid of consumers) this.paintCell(this.cells.get(cid).get(label), g, label, cid, held);
        const totals = pqTotals(g, label, held);
        for (const [title, figure] of METRICS) {
          const [text, hot] = figure(totals, g.queues[label]);
          const td = this.figures.get(title).get(label);
          setText(td, text);
          setClass(td, "hot", hot);
        }
        drawSparkline(this.figures.get(TREND).get(label), lagSeries.get(g.name)?.queues.get(label), 64, 18);
      }
    }

    build(pop, queues, consumers) {
      this.heads = new Map();     // label -> th.queue-head
      this.rows = new Map();      // client id -> tr
      this.cells = new Map();     // client id -> label -> td.cell
      this.figures = new Map();   // metric title -> label -> td
      const head = el("tr", {}, el("th", { class: "corner" }, pop ? "received by" : "owned by"), queues.map((label) => {
        const th = el("th", { class: "queue-head", scope: "col", "data-queue": label },
          el("span", { class: "qlabel" }, label), el("span", { class: "qnote" }));
        this.heads.set(label, th);
        return th;
      }));
      const rows = consumers.map((cid) => {
        const cells = new Map(queues.map((label) => [label, el("td", { class: "cell", "data-cell-queue": label, "data-consumer": cid })]));
        const tr = el("tr", { "data-consumer": cid }, el("th", { scope: "row", class: "consumer", title: cid }), [...cells.values()]);
        this.rows.set(cid, tr);
        this.cells.set(cid, cells);
        return tr;
      });
      const foot = [...METRICS.map(([title]) => title), TREND].map((title) => {
        const tds = new Map(queues.map((label) => [label, el("td", { "data-cell-queue": label })]));
        this.figures.set(title, tds);
        return el("tr", { class: title === TREND ? "metric trend" : "metric" }, el("th", { scope: "row" }, title), [...tds.values()]);
      });
      this.root.className = `matrix${pop ? " pop" : ""}`;
      this.root.replaceChildren(el("thead", {}, head), el("tbody", {}, rows), el("tfoot", {}, foot));
    }

    paintHead(th, label, facts, pop) {
      const { owners, state, owner } = facts;
      const note = pop ? (owners.length > 2 ? `${owners.length} consumers` : owners.map(shortCid).join(", ") || "no pops")
        : state === "owned" ? shortCid(owner) : state === "contested" ? `${owners.length} owners` : "unowned";
      setClassName(th, `queue-head ${state}`);
      setData(th, "state", state);
      setData(th, "owner", owner);
      setData(th, "owners", owners.join(","));
      setAttr(th, "title", pop ? `recent messages of ${label} went to ${owners.join(", ") || "nobody yet"}` : `${label}: ${owners.join(", ") || "no owner"}`);
      setText(th.lastChild, note);
      // The owner's colour under the label, as in the dense grid.
      setStyle(th, state === "owned" ? `box-shadow: inset 0 -3px ${colourOf(owner)}` : "");
    }

    paintConsumer(g, cid) {
      const c = g.clients[cid] || {};
      const status = c.status || "running";
      const tr = this.rows.get(cid);
      setData(tr, "status", status);
      setClass(tr, "dead", !isAlive(g, cid));
      const noops = g.noopRebalances[cid] || 0;
      const look = JSON.stringify([status, c.slow_ms, c.fail_ratio, c.client, c.assignment_source, c.language, c.version, c.note, noops]);
      const th = tr.firstChild;
      if (th.shownLook !== look) {
        th.shownLook = look;
        th.title = `${cid}: ${noopText(noops)}`;
        th.replaceChildren(...consumerLabel(cid, c, status));
      }
    }

    // What-if: a queue that would move, and its cells of the consumers it would leave or join.
    markMoves(moves) {
      this.marked = moves.size > 0;
      for (const [label, th] of this.heads) {
        const move = moves.get(label);
        setMark(th, Boolean(move));
        for (const [cid, cells] of this.cells) setMark(cells.get(label), Boolean(move) && (move.to === cid || move.from.includes(cid)));
      }
    }

    paintCell(td, g, label, cid, held) {
      if (g.mode === "pop") {
        const n = popsOf(g, label).filter((x) => x === cid).length;
        setData(td, "received", String(n));
        setStyle(td, n ? `background:${colourOf(cid)};opacity:${(0.25 + 0.75 * (n / POP_WINDOW)).toFixed(2)}` : "");
        setText(td, n ? String(n) : "");
        return;
      }
      const owns = held.includes(cid);
      setClassName(td, owns ? "cell owns" : "cell");
      setStyle(td, owns ? `background:${colourOf(cid)}` : "");
    }
  }

  // A cell's fill: its owner's colour; several owners (or pop receivers) striped.
  function fillOf(owners) {
    if (!owners.length) return "";
    if (owners.length === 1) return `background:${colourOf(owners[0])}`;
    const stripes = owners.slice(0, 4).map((cid, i) => `${colourOf(cid)} ${i * 3}px ${(i + 1) * 3}px`);
    return `background:repeating-linear-gradient(135deg,${stripes.join(",")})`;
  }

  // Large groups: one small cell per queue, grouped by broker, filled in its owner's colour;
  // two owners striped and outlined red, none hatched grey (lab.css). A legend names each
  // consumer: hovering or focusing one highlights its queues, a click keeps the highlight.
  // Hovering a cell shows its figures in a tooltip.
  class GridView {
    constructor(name) {
      this.summary = el("span", { class: "grid-summary", "data-role": "summary" });
      const sample = (state, text, extra = "") => el("span", { class: "key" }, el("span", { class: `qcell ${extra}`, "data-state": state }), text);
      const key = el("span", { class: "grid-key" }, sample("contested", "2+ owners"), sample("unowned", "unowned"),
        sample("owned", "over a flow-control threshold", "hot"), "· hover a cell for its figures");
      this.legend = el("div", { class: "legend", role: "group", "aria-label": "consumers: hover or click one to highlight its queues" });
      this.blocks = el("div", { class: "broker-blocks" });
      this.tip = el("div", { class: "qtip", role: "tooltip", hidden: true });
      this.root = el("div", { class: "assign-grid", "data-assignment-group": name },
        el("div", { class: "grid-head" }, this.summary, key), this.legend, this.blocks, this.tip);
      this.cells = new Map();     // label -> cell
      this.brokers = new Map();   // broker -> {section, name, grid}
      this.entries = new Map();   // client id -> legend entry
      this.queuesKey = null;
      this.consumersKey = null;
      this.hovered = null;        // the legend entry under the pointer (or focused)
      this.pinned = null;         // the legend entry clicked
      this.tipLabel = null;       // the queue the tooltip describes
      this.listen();
    }

    get focus() { return this.hovered || this.pinned; }

    listen() {
      const consumerOf = (event) => event.target.closest(".legend-item")?.dataset.consumer;
      const preview = (cid) => { this.hovered = cid; this.applyFocus(); };
      this.legend.addEventListener("mouseover", (event) => { const cid = consumerOf(event); if (cid) preview(cid); });
      this.legend.addEventListener("focusin", (event) => preview(consumerOf(event) || null));
      this.legend.addEventListener("mouseleave", () => preview(null));
      this.legend.addEventListener("focusout", () => preview(null));
      this.legend.addEventListener("click", (event) => {
        const cid = consumerOf(event);
        if (!cid) return;
        this.pinned = this.pinned === cid ? null : cid;
        this.applyFocus();
      });
      this.blocks.addEventListener("mouseover", (event) => {
        const cell = event.target.closest("[data-queue]");
        if (cell) this.showTip(cell);
      });
      this.blocks.addEventListener("mouseleave", () => this.hideTip());
    }

    update(g, queues, consumers, holders) {
      this.g = g;
      this.holders = holders;
      this.syncCells(queues);
      const held = new Map();   // client id -> how many queues it holds (pop: received from)
      const issues = { contested: 0, unowned: 0 };
      for (const label of queues) {
        const facts = queueFacts(g, label, holders.get(label));
        for (const cid of facts.owners) held.set(cid, (held.get(cid) || 0) + 1);
        if (facts.state in issues) issues[facts.state] += 1;
        this.paint(this.cells.get(label), facts, isHot(pqTotals(g, label, holders.get(label))));
      }
      this.syncLegend(g, consumers, held);
      const alive = consumers.filter((c) => isAlive(g, c)).length;
      setText(this.summary, g.mode === "pop"
        ? `${queues.length} queues · ${alive} consumers · pop: each queue is shared, a cell shows who received its messages lately`
        : `${queues.length} queues · ${alive} consumers · ${issues.contested} with 2+ owners · ${issues.unowned} unowned`);
      setClass(this.summary, "issues", issues.contested + issues.unowned > 0);
      if (this.tipLabel) this.fillTip();
    }

    // Cells are made once per queue and kept; only a change of the topic's queues adds,
    // removes or moves them.
    syncCells(queues) {
      const key = queues.join(" ");
      if (key === this.queuesKey) return;
      this.queuesKey = key;
      const wanted = new Set(queues);
      for (const [label, cell] of this.cells) {
        if (!wanted.has(label)) {
          cell.remove();
          this.cells.delete(label);
        }
      }
      const byBroker = new Map();
      for (const label of queues) {
        const broker = splitLabel(label)[0];
        if (!byBroker.has(broker)) byBroker.set(broker, []);
        if (!this.cells.has(label)) this.cells.set(label, el("span", { class: "qcell", "data-queue": label }));
        byBroker.get(broker).push(this.cells.get(label));
      }
      for (const [broker, block] of this.brokers) {
        if (!byBroker.has(broker)) {
          block.section.remove();
          this.brokers.delete(broker);
        }
      }
      for (const [broker, cells] of byBroker) {
        if (!this.brokers.has(broker)) {
          const name = el("h3", { class: "broker-name" }), grid = el("div", { class: "cells" });
          this.brokers.set(broker, { section: el("section", { class: "broker-block", "data-broker": broker }, name, grid), name, grid });
        }
        const block = this.brokers.get(broker);
        setText(block.name, `${broker} (${cells.length})`);
        block.grid.append(...cells);           // moves kept cells into order, adds new ones
        this.blocks.append(block.section);     // brokers in order too
      }
      setClass(this.root, "many", queues.length > 512);   // smaller cells (lab.css)
    }

    paint(cell, facts, hot) {
      const owners = facts.owners.join(",");
      const moved = cell.dataset.owners !== owners;
      setData(cell, "owners", owners);
      setData(cell, "owner", facts.owner);
      setData(cell, "state", facts.state);
      setStyle(cell, fillOf(facts.owners));
      setClass(cell, "hot", hot);
      if (moved) this.highlight(cell);
    }

    markMoves(moves) {
      this.marked = moves.size > 0;
      for (const [label, cell] of this.cells) setMark(cell, moves.has(label));
    }

    syncLegend(g, consumers, held) {
      const key = consumers.join(" ");
      if (key !== this.consumersKey) {
        this.consumersKey = key;
        const wanted = new Set(consumers);
        for (const [cid, entry] of this.entries) {
          if (!wanted.has(cid)) {
            entry.remove();
            this.entries.delete(cid);
          }
        }
        for (const cid of consumers) {
          if (!this.entries.has(cid)) this.entries.set(cid, el("button", { type: "button", class: "legend-item", "data-consumer": cid, "aria-pressed": "false" }));
        }
        this.legend.append(...consumers.map((cid) => this.entries.get(cid)));
      }
      for (const cid of consumers) {
        const c = g.clients[cid] || {};
        const status = c.status || "running";
        const count = held.get(cid) || 0;
        const entry = this.entries.get(cid);
        setData(entry, "status", status);
        setClass(entry, "dead", !isAlive(g, cid));
        const noops = g.noopRebalances[cid] || 0;
        const look = `${status}|${count}|${c.slow_ms || 0}|${c.fail_ratio || 0}|${noops}`;
        if (entry.shownLook === look) continue;
        entry.shownLook = look;
        const faults = [c.slow_ms ? `slow ${c.slow_ms} ms` : "", c.fail_ratio ? `fail ${Math.round(c.fail_ratio * 100)}%` : ""].filter(Boolean);
        entry.title = [`${cid}: ${status}`, `${count} queue(s)`, noopText(noops), ...faults, c.client && c.client !== "ours" ? c.client : ""].filter(Boolean).join(" · ");
        entry.replaceChildren(el("span", { class: "swatch", style: `background:${colourOf(cid)}` }), cidLabel(cid),
          el("span", { class: "count" }, String(count)), ...(status !== "running" ? [el("span", { class: `status ${status}` }, status)] : []));
      }
    }

    applyFocus() {
      const focus = this.focus;
      setClass(this.root, "focusing", Boolean(focus));
      for (const [cid, entry] of this.entries) {
        setClass(entry, "focused", cid === focus);
        setAttr(entry, "aria-pressed", String(cid === this.pinned));
      }
      for (const cell of this.cells.values()) this.highlight(cell);
    }

    highlight(cell) {
      const focus = this.focus;
      setClass(cell, "highlight", Boolean(focus) && cell.dataset.owners.split(",").includes(focus));
    }

    showTip(cell) {
      this.tipLabel = cell.dataset.queue;
      this.fillTip();
      this.tip.hidden = false;
      // Below the cell, or above it near the window's bottom; never past the right edge.
      const box = cell.getBoundingClientRect();
      const below = box.bottom + 6 + this.tip.offsetHeight < innerHeight;
      this.tip.style.left = `${Math.max(4, Math.min(box.left, innerWidth - this.tip.offsetWidth - 4))}px`;
      this.tip.style.top = `${below ? box.bottom + 6 : box.top - 6 - this.tip.offsetHeight}px`;
    }

    hideTip() {
      this.tipLabel = null;
      this.tip.hidden = true;
    }

    fillTip() {
      const label = this.tipLabel;
      if (!this.cells.has(label)) return this.hideTip();
      const held = this.holders.get(label);
      const lines = queueDetails(this.g, label, queueFacts(this.g, label, held), pqTotals(this.g, label, held));
      const series = lagSeries.get(this.g.name);
      const key = `${lines.join("\n")}|${series ? series.version : 0}`;
      if (this.tip.dataset.text === key) return;
      this.tip.dataset.text = key;
      const trend = el("div", { class: "tip-trend" });
      drawSparkline(trend, series?.queues.get(label), 180, 32);
      this.tip.replaceChildren(...lines.map((line, i) => el(i ? "div" : "b", {}, line)), el("div", { class: "muted" }, "lag, last 5 min"), trend);
    }
  }

  // Bars for at most this many queues: a plotly redraw costs ~0.4 ms per bar (100 ms at
  // 256 queues on 2 cores, a long task twice a second) and 1024 bars have no readable labels.
  const PQ_CHART_MAX_BARS = 48;
  // How close a queue's ProcessQueue is to flow control: its highest figure/threshold ratio.
  const depth = (t) => Math.max(t.cached_count / THRESHOLDS.cached_count, t.cached_bytes / MIB / THRESHOLDS.cached_mib, t.span / THRESHOLDS.span);

  // The deepest `max` of `queues`, in queue order (all of them when they are few).
  function deepest(queues, totals, max) {
    if (queues.length <= max) return queues;
    const chosen = new Set([...queues].sort((a, b) => depth(totals.get(b)) - depth(totals.get(a))).slice(0, max));
    return queues.filter((label) => chosen.has(label));
  }

  // ProcessQueue depth per queue against RocketMQ's flow-control thresholds; in a large
  // group, of the deepest queues only (the grid marks every queue over a threshold).
  function drawPqChart(g) {
    const div = document.getElementById(`pq-${g.name}`);
    if (!div || !window.Plotly) return;
    const all = queuesOf(g);
    const holders = ownerIndex(g, all);
    const totalsOf = new Map(all.map((l) => [l, pqTotals(g, l, holders.get(l))]));
    const queues = deepest(all, totalsOf, PQ_CHART_MAX_BARS);
    const caption = div.previousElementSibling;
    setText(caption, queues.length < all.length ? `ProcessQueues: the ${queues.length} deepest of ${all.length} queues` : "");
    const totals = queues.map((l) => totalsOf.get(l));
    const colour = queues.map((l) => holders.get(l)).map((o) => (o.length === 1 ? colourOf(o[0]) : o.length ? "#d33" : "#bbb"));
    const drawn = JSON.stringify([queues, totals, colour]);
    if (div.drawn === drawn) return;   // the same bars: no plotly work
    div.drawn = drawn;
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
      case "offset_moved":
        return `${e.client_id} skipped ${e.skipped} message(s) of ${e.queue}: offset ${e.from_offset} was deleted, corrected to ${e.to_offset}`;
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
    // The user's topics only: a group's %RETRY% and %DLQ% topics are the broker's, never a
    // target of a rate, a burst or a queue change (and sort first in Java's order).
    const topics = Object.keys(lab.topics).filter((t) => !isSystemTopic(t)).sort(javaOrder);
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
    // Rebuilt only when a broker comes, goes or flips: a button replaced under the pointer loses its click.
    const look = brokerNames.map((b) => `${b}:${lab.brokers[b].online !== false}`).join(",");
    if (host.dataset.look === look) return updateProducerRate();
    host.dataset.look = look;
    host.replaceChildren(el("span", { class: "label" }, "Brokers"), ...brokerNames.map((b) => {
      const online = lab.brokers[b].online !== false;
      return el("span", { class: `broker ${online ? "online" : "offline"}`, "data-broker": b, "data-online": online ? "1" : "0" },
        el("span", { class: "dot" }), b, " ",
        el("button", { type: "button", "data-action": online ? "offline" : "online",
          disabled: !!disabledReason("broker_online"), title: disabledReason("broker_online") || null,
          onclick: (event) => callApi(`/api/brokers/${encodeURIComponent(b)}/${online ? "offline" : "online"}`, {}, event.currentTarget) },
        online ? "take offline" : "bring online"));
    }));
    updateProducerRate();
  }

  // RocketMQ's own topics (TopicValidator's system topics, the groups' retry and dead-letter ones).
  const SYSTEM_TOPICS = new Set(["SCHEDULE_TOPIC_XXXX", "TBW102", "OFFSET_MOVED_EVENT", "SELF_TEST_TOPIC", "BenchmarkTest",
    "TRANS_CHECK_MAX_TIME_TOPIC"]);
  const isSystemTopic = (t) => t.startsWith("%") || SYSTEM_TOPICS.has(t) || /^(RMQ_SYS_|rmq_sys_)/.test(t);

  function updateProducerRate() {
    const topic = document.querySelector("#producer-form .topic-select").value;
    const producer = lab.producers[topic];
    showInForce(document.querySelector('#producer-form input[name="rate"]'), producer ? producer.rate : 0, topic);
    setText(document.getElementById("producer-rate"), producer && producer.rate !== undefined ? `now ${fmt(producer.rate)} msg/s` : "");
  }

  // ------------------------------------------------------------------ what-if
  //
  // Picking another strategy first asks the server what it would do: the assignment the
  // members would compute (their own allocate.py, over the live members and online
  // queues) and the queues that would move. The panel lists them, the assignment view
  // outlines their cells, and only Apply switches. While the group changes underneath,
  // the preview is asked again.

  const MOVES_LISTED = 12;        // more are outlined in the view, not listed
  const NO_MOVES = new Map();
  const previews = new Map();     // group name -> {strategy, answer, moves: label -> move, basis, loading}

  // What a preview depends on: when this changes, it is out of date.
  const previewBasis = (g) => JSON.stringify([g.strategy, queuesOf(g), consumersOf(g).filter((c) => isAlive(g, c)), g.assignments]);

  async function previewStrategy(card, name, strategy) {
    const g = lab.groups[name];
    const select = card.querySelector('[data-control="strategy"]');
    if (!g || strategy === g.strategy) return closePreview(card, name);
    if (g.mode === "pop") {   // pop consumers ignore the strategy: nothing to preview
      return callApi(`/api/groups/${encodeURIComponent(name)}/strategy`, { strategy }, select);
    }
    select.dataset.busy = "1";   // the pick stays while it is previewed (setSelect)
    const entry = { ...(previews.get(name) || {}), strategy, basis: previewBasis(g), loading: true };
    previews.set(name, entry);
    try {
      const response = await fetch(`/api/groups/${encodeURIComponent(name)}/strategy/preview?strategy=${encodeURIComponent(strategy)}`,
        { credentials: "same-origin" });
      const answer = await response.json().catch(() => ({ error: `${response.status} ${response.statusText}` }));
      if (previews.get(name) !== entry) return;   // cancelled, or a newer pick
      if (!response.ok) {
        showError(answer.error || `${response.status} ${response.statusText}`, select);
        return closePreview(card, name);
      }
      Object.assign(entry, { answer, moves: new Map(answer.moves.map((m) => [m.queue, m])), loading: false });
      showPreview(card, name, entry);
    } catch (err) {
      if (previews.get(name) !== entry) return;
      showError(`Request failed: ${err.message}`, select);
      closePreview(card, name);
    }
  }

  function refreshPreview(card, g) {
    const entry = previews.get(g.name);
    if (entry && !entry.loading && entry.basis !== previewBasis(g)) previewStrategy(card, g.name, entry.strategy);
  }

  function showPreview(card, name, entry) {
    const { strategy, answer, moves } = entry;
    const g = lab.groups[name];
    const panel = card.querySelector('[data-role="strategy-preview"]');
    const who = (m) => `${m.queue}: ${m.from.join(" + ") || "nobody"} → ${m.to || "nobody"}`;
    const listed = answer.moves.slice(0, MOVES_LISTED);
    const apply = el("button", { type: "button", "data-action": "apply-strategy" }, `Apply ${strategy}`);
    apply.addEventListener("click", async () => {
      entry.loading = true;   // not asked again while the switch itself changes the group
      const done = await callApi(`/api/groups/${encodeURIComponent(name)}/strategy`, { strategy }, apply);
      entry.loading = false;
      if (done) closePreview(card, name);
    });
    panel.replaceChildren(
      el("p", { "data-role": "preview-summary", "data-moved": String(answer.moved) },
        el("b", {}, `${answer.moved} queue${answer.moved === 1 ? "" : "s"} would move`),
        ` switching ${g ? g.strategy : "?"} → ${strategy}, as the members would compute it now` +
        (answer.moved ? " (outlined below)" : "")),
      listed.length ? el("ul", { class: "moves", "data-role": "preview-moves" }, listed.map((m) => el("li", {}, who(m))),
        answer.moves.length > listed.length ? el("li", { class: "more" }, `… and ${answer.moves.length - listed.length} more`) : null) : null,
      el("div", { class: "preview-actions" }, apply,
        el("button", { type: "button", "data-action": "cancel-strategy", onclick: () => closePreview(card, name) }, "Cancel")));
    panel.hidden = false;
    views.get(name)?.markMoves(moves);
  }

  function closePreview(card, name) {
    previews.delete(name);
    const panel = card.querySelector('[data-role="strategy-preview"]');
    panel.hidden = true;
    panel.replaceChildren();
    const select = card.querySelector('[data-control="strategy"]');
    delete select.dataset.busy;
    if (lab.groups[name]) select.value = lab.groups[name].strategy;
    views.get(name)?.markMoves(NO_MOVES);
  }

  // ------------------------------------------------------------------ lag lines and replay
  //
  // The controller keeps a sample a second of the last 15 minutes (timeline.py). The page
  // asks it once for the last 5 minutes of lag, then appends each snapshot's figures: each
  // queue's lag as a sparkline (matrix row, grid tooltip), the group's total lag and time
  // lag as lines. The Replay slider shows the assignment view at a past second instead.

  const SERIES_MS = 5 * 60 * 1000;
  const lagSeries = new Map();   // group -> {version, ts: [], total: [], time: [], queues: Map(label -> [])}
  const replays = new Map();     // group -> the sample shown instead of now ({ts, queues})

  async function loadLagSeries(name) {
    try {
      const response = await fetch(`/api/groups/${encodeURIComponent(name)}/lag?seconds=300`, { credentials: "same-origin" });
      if (!response.ok) return;
      const s = await response.json();
      const mine = lagSeries.get(name);
      const since = mine && mine.ts.length ? mine.ts[0] : Infinity;   // keep what snapshots added meanwhile
      const keep = s.ts.filter((ts) => ts < since).length;
      const merged = { version: (mine?.version || 0) + 1, ts: s.ts.slice(0, keep), total: s.total_lag.slice(0, keep),
        time: s.time_lag_ms.slice(0, keep), queues: new Map(Object.entries(s.queues).map(([label, v]) => [label, v.slice(0, keep)])) };
      if (mine) {
        merged.ts.push(...mine.ts);
        merged.total.push(...mine.total);
        merged.time.push(...mine.time);
        const n = mine.ts.length;
        for (const [label, values] of mine.queues) {
          const before = merged.queues.get(label) || new Array(keep).fill(null);
          merged.queues.set(label, before.concat(values));
        }
        for (const [label, values] of merged.queues) if (values.length < keep + n) values.push(...new Array(keep + n - values.length).fill(null));
      }
      lagSeries.set(name, merged);
      scheduleRender();
    } catch (err) {
      // The lines start empty and fill from the snapshots instead.
    }
  }

  function appendLag(name, g) {
    let s = lagSeries.get(name);
    if (!s) lagSeries.set(name, (s = { version: 0, ts: [], total: [], time: [], queues: new Map() }));
    const now = Date.now();
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

  // A line of `values` (nulls break it) in an inline SVG filling `host`.
  function drawSparkline(host, values, width, height) {
    if (!host) return;
    const key = values ? `${values.length}|${values.at(-1)}|${values[0]}` : "";
    if (host.drawnKey === key) return;
    host.drawnKey = key;
    if (!values || !values.length) return host.replaceChildren();
    const max = Math.max(1, ...values.filter((v) => v !== null));
    const step = values.length > 1 ? width / (values.length - 1) : 0;
    let d = "", pen = false;
    values.forEach((v, i) => {
      if (v === null) { pen = false; return; }
      d += `${pen ? "L" : "M"}${(i * step).toFixed(1)},${(height - 1 - (v / max) * (height - 2)).toFixed(1)}`;
      pen = true;
    });
    const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    svg.setAttribute("width", width);
    svg.setAttribute("height", height);
    svg.setAttribute("class", "spark");
    svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", `lag from ${values.find((v) => v !== null) ?? 0} to ${values.at(-1) ?? 0}, peak ${max}`);
    const path = document.createElementNS("http://www.w3.org/2000/svg", "path");
    path.setAttribute("d", d);
    svg.append(path);
    host.replaceChildren(svg);
  }

  function showLagLines(card, g) {
    const host = card.querySelector('[data-role="lag-lines"]');
    const s = lagSeries.get(g.name);
    if (!s || !s.ts.length) return;
    if (host.shownVersion === s.version) return;
    host.shownVersion = s.version;
    if (!host.firstChild) {
      host.append(el("span", { class: "lag-line", "data-role": "total-lag" }, el("span", { class: "what" }), el("span", { class: "line" })),
        el("span", { class: "lag-line", "data-role": "time-lag" }, el("span", { class: "what" }), el("span", { class: "line" })));
    }
    const [total, time] = host.children;
    setText(total.firstChild, `total lag ${fmt(s.total.at(-1))} (5 min peak ${fmt(Math.max(...s.total))})`);
    setText(time.firstChild, `time lag ${fmtTimeLag(s.time.at(-1))}`);
    drawSparkline(total.lastChild, s.total, 240, 28);
    drawSparkline(time.lastChild, s.time, 240, 28);
  }

  let replayTimer = null;
  function replayAt(card, name, secondsAgo) {
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
      const response = await fetch(`/api/groups/${encodeURIComponent(name)}/at?ts=${Math.round(ts)}`, { credentials: "same-origin" });
      const answer = await response.json().catch(() => ({ error: `${response.status}` }));
      if (Number(card.querySelector('[data-role="replay"]').value) !== secondsAgo) return;   // moved on meanwhile
      if (!response.ok) {
        setText(state, answer.error || "nothing kept for that time");
        return;
      }
      replays.set(name, answer);
      card.dataset.replay = String(answer.ts);
      setText(state, `replaying ${clock(answer.ts)} (${fmtMs(Date.now() - answer.ts)} ago)`);
      live.hidden = false;
      scheduleRender();
    }, 150);
  }

  // The group as the replayed second saw it: owners, lag and cached messages per queue.
  function replayedGroup(g, replay) {
    const assignments = {};
    const queues = {}, pq = {};
    for (const [label, q] of Object.entries(replay.queues)) {
      for (const cid of q.owners) (assignments[cid] = assignments[cid] || []).push(label);
      queues[label] = { lag: q.lag, time_lag_ms: q.time_lag_ms };
      pq[label] = { "*": { cached_count: q.cached_count, cached_bytes: 0, span: 0 } };
    }
    return { ...g, assignments, queues, pq, pops: {} };
  }

  // ------------------------------------------------------------------ hand-offs
  //
  // What each rebalance did to messages (consumers_app/lab/handoff.py): the strip shows the
  // last 15 minutes' rebalances that moved queues, placed by time, red when they caused
  // duplicates; a click opens its hand-offs - per moved queue who gave it to whom, the gap
  // (nobody consumed it) or overlap (two did), the messages consumed twice (exact, from
  // the consumers' own consumed offsets) and the lag spike. The totals line sums the window.

  const HANDOFF_WINDOW_MS = 15 * 60 * 1000;
  const openRebalance = new Map();   // group name -> {id, stamp, answer}

  const plural = (n, word) => `${fmt(n)} ${word}${n === 1 ? "" : "s"}`;

  function handoffTotalsLine(t) {
    if (!t.rebalances) return "Last 15 min: no rebalance moved a queue.";
    return `Last 15 min: ${plural(t.rebalances, "rebalance")} moved ${plural(t.moved, "queue")} · ` +
      `${duplicatesText(t)} · longest gap ${fmtMs(t.gap_ms)} · longest overlap ${fmtMs(t.overlap_ms)}` +
      (t.lag_spike !== null && t.lag_spike !== undefined ? ` · biggest lag spike ${fmt(t.lag_spike)}` : "");
  }

  // The consumed-twice figure as every place words it: a move to or from a peer (which
  // reports no consumed offsets) is "not measured", never a 0 that would claim none.
  function duplicatesText(r) {
    const measured = r.moved - (r.unmeasured || 0);
    if (!measured) return "consumed twice: not measured (moves to or from a peer)";
    return `${plural(r.duplicates, "message")} consumed twice` +
      (r.unmeasured ? ` (${plural(r.unmeasured, "move")} to or from a peer not measured)` : "");
  }

  function rebalanceTitle(r) {
    return [`${clock(r.ts)} ${r.reason || "rebalance"}`, `${plural(r.moved, "queue")} moved among ${r.clients.join(", ")}`,
      `${duplicatesText(r)} · gap ${fmtMs(r.gap_ms)} · overlap ${fmtMs(r.overlap_ms)}${r.overlap_ongoing ? " (ongoing)" : ""}`].join("\n");
  }

  // The header and the totals line read the same record (the hand-offs of the window), so
  // they never disagree; a consumer's rebalance that only took queues nobody held (its
  // start) moved none, and says so.
  function lastRebalanceLine(g) {
    const rebalances = g.handoffs.rebalances || [];
    const r = rebalances[rebalances.length - 1];
    if (r) return `Last rebalance that moved queues ${clock(r.ts)}: ${r.reason || "rebalance"} · ` +
      `${plural(r.moved, "queue")} moved among ${r.clients.join(", ")}`;
    const c = g.lastRebalance;
    return "No rebalance has moved a queue in the last 15 min." + (c
      ? ` Last assignment change ${clock(c.ts)}${c.client_id ? ` by ${c.client_id}` : ""}: ${c.reason || "periodic"} · ${changedCount(c)} queue(s) taken or released, none from another consumer`
      : "");
  }

  function showHandoffs(card, g) {
    const { totals = {}, rebalances = [] } = g.handoffs;
    const line = card.querySelector('[data-role="handoff-totals"]');
    setText(line, handoffTotalsLine(totals));
    setData(line, "duplicates", String(totals.duplicates || 0));
    setData(line, "moved", String(totals.moved || 0));
    const strip = card.querySelector('[data-role="rebalances"]');
    const now = Date.now();
    const left = (ts) => `left:${Math.max(0, Math.min(100, 100 - ((now - ts) / HANDOFF_WINDOW_MS) * 100)).toFixed(2)}%`;
    // Marks closer than CLUSTER_MS are one cluster (a button with their count, listing them
    // on a click): marks on top of each other would hide all but the top one, and it
    // would swallow the clicks. The clusters follow from the times alone: stable as the
    // strip scrolls, rebuilt only when a rebalance comes or goes.
    const clusters = clustersOf(rebalances);
    const shape = clusters.map((c) => c.map((r) => r.id).join(",")).join("|");
    if (strip.dataset.shape !== shape) {
      const openList = strip.querySelector('.rebalance-cluster:not(.closed)')?.dataset.ids;
      strip.dataset.shape = shape;
      strip.replaceChildren(...clusters.map((c) => (c.length === 1 ? rebalanceMark(card, g.name)
        : rebalanceCluster(card, g.name, c, openList))));
    }
    const open = openRebalance.get(g.name);
    for (const cluster of strip.querySelectorAll(".rebalance-cluster")) {
      const members = rebalances.filter((r) => cluster.dataset.ids.split(",").includes(String(r.id)));
      const head = cluster.querySelector(".rebalance-cluster-head");
      setStyle(cluster, left(members[0].ts));
      setClass(cluster, "late", now - members[0].ts < HANDOFF_WINDOW_MS / 2);   // its list opens leftwards
      setClass(cluster, "dupes", members.some((r) => r.duplicates > 0));
      setAttr(head, "title", `${members.length} rebalances ${clock(members[0].ts)}–${clock(members[members.length - 1].ts)}, ` +
        `${plural(members.reduce((n, r) => n + r.moved, 0), "queue")} moved: click for the list`);
    }
    const marks = [...strip.querySelectorAll(".rebalance-mark")];
    rebalances.forEach((r, i) => {
      const mark = marks[i];
      const inCluster = Boolean(mark.closest(".rebalance-cluster"));
      mark.onclick = () => {
        mark.closest(".rebalance-cluster")?.classList.add("closed");   // its list would cover the panel
        openHandoff(card, g.name, r.id);
      };
      setData(mark, "rebalanceId", String(r.id));
      setData(mark, "ts", String(r.ts));
      setData(mark, "endTs", String(r.end_ts));
      setData(mark, "duplicates", String(r.duplicates));
      setData(mark, "moved", String(r.moved));
      setClass(mark, "dupes", r.duplicates > 0);
      setClass(mark, "open", Boolean(open) && open.id === r.id);
      setAttr(mark, "title", rebalanceTitle(r));
      setAttr(mark, "aria-label", `rebalance at ${clock(r.ts)}: ${plural(r.moved, "queue")} moved, ${duplicatesText(r)}`);
      setText(mark, inCluster ? `${clock(r.ts)} ${r.reason || "rebalance"} · ${r.moved} moved` : "");
      setStyle(mark, inCluster ? "" : left(r.ts));
      // An open rebalance whose figures moved on (the new owner caught up): ask again.
      if (open && open.id === r.id && !open.loading && open.stamp !== `${r.moved}|${r.duplicates}|${r.gap_ms}|${r.overlap_ms}|${r.lag_spike}`) {
        openHandoff(card, g.name, r.id, true);
      }
    });
    setClass(strip, "no-rebalances", !rebalances.length);   // not "empty": that class is the groups' placeholder
  }

  const CLUSTER_MS = HANDOFF_WINDOW_MS * 0.02;   // 18 s: 2% of the strip's width

  function clustersOf(rebalances) {
    const clusters = [];
    for (const r of rebalances) {
      const last = clusters[clusters.length - 1];
      if (last && r.ts - last[last.length - 1].ts < CLUSTER_MS) last.push(r);
      else clusters.push([r]);
    }
    return clusters;
  }

  function rebalanceMark() {
    return el("button", { type: "button", class: "rebalance-mark" });
  }

  function rebalanceCluster(card, name, members, openIds) {
    const ids = members.map((r) => r.id).join(",");
    const list = el("div", { class: "rebalance-cluster-list", role: "list" }, members.map(() => rebalanceMark()));
    const cluster = el("div", { class: `rebalance-cluster${openIds === ids ? "" : " closed"}`, "data-ids": ids }, null, list);
    const head = el("button", { type: "button", class: "rebalance-cluster-head", "aria-haspopup": "true",
      onclick: () => {
        const closing = !cluster.classList.contains("closed");
        for (const other of card.querySelectorAll(".rebalance-cluster")) other.classList.add("closed");
        cluster.classList.toggle("closed", closing);
        head.setAttribute("aria-expanded", String(!closing));
      } }, String(members.length));
    cluster.prepend(head);
    return cluster;
  }

  async function openHandoff(card, name, id, refresh = false) {
    const panel = card.querySelector('[data-role="handoff"]');
    const current = openRebalance.get(name);
    if (refresh) {
      if (!current || current.id !== id || current.loading) return;   // closed meanwhile, or already asking
    } else if (current && current.id === id) {
      return closeHandoff(card, name);   // a second click closes
    }
    const entry = { id, stamp: current && current.id === id ? current.stamp : "", loading: true };
    openRebalance.set(name, entry);
    try {
      const response = await fetch(`/api/groups/${encodeURIComponent(name)}/rebalances/${id}`, { credentials: "same-origin" });
      const answer = await response.json().catch(() => ({ error: `${response.status} ${response.statusText}` }));
      if (openRebalance.get(name) !== entry) return;
      if (!response.ok) return handoffError(panel, answer.error || `${response.status} ${response.statusText}`);
      entry.loading = false;
      entry.stamp = `${answer.moved}|${answer.duplicates}|${answer.gap_ms}|${answer.overlap_ms}|${answer.lag_spike}`;
      panel.replaceChildren(...handoffPanel(card, name, answer));
      panel.hidden = false;
      for (const mark of card.querySelectorAll(".rebalance-mark")) setClass(mark, "open", mark.dataset.rebalanceId === String(id));
    } catch (err) {
      if (openRebalance.get(name) !== entry) return;
      handoffError(panel, `Request failed: ${err.message}`);
    }
  }

  // Under the marks, where the click was (a second click on the mark closes it).
  function handoffError(panel, message) {
    panel.replaceChildren(el("p", { class: "control-error", "data-role": "control-error", role: "alert" }, message));
    panel.hidden = false;
  }

  function closeHandoff(card, name) {
    openRebalance.delete(name);
    const panel = card.querySelector('[data-role="handoff"]');
    panel.hidden = true;
    panel.replaceChildren();
    for (const mark of card.querySelectorAll(".rebalance-mark.open")) mark.classList.remove("open");
  }

  function handoffPanel(card, name, r) {
    const head = el("p", { class: "handoff-summary", "data-role": "handoff-summary", "data-rebalance-id": String(r.id),
      "data-duplicates": String(r.duplicates), "data-moved": String(r.moved) },
      el("b", {}, `Rebalance at ${clock(r.ts)}`), ` (${r.reason || "rebalance"}): ${plural(r.moved, "queue")} moved, `,
      el("b", {}, duplicatesText(r)),
      ` · gap up to ${fmtMs(r.gap_ms)} · overlap up to ${fmtMs(r.overlap_ms)}`,
      el("button", { type: "button", class: "close", "data-action": "close-handoff", onclick: () => closeHandoff(card, name) }, "Close"));
    const why = el("p", { class: "handoff-why" },
      "Each consumer rebalances on its own. The new owner starts at the committed offset, so what the old owner consumed " +
      "after its last commit is consumed again (RocketMQ's at-least-once). An overlap is when both held the queue; a gap when neither consumed it.");
    const rows = r.moves.map((m) => el("tr", { "data-handoff-queue": m.queue, "data-duplicates": String(m.duplicates) },
      el("td", {}, m.queue), el("td", {}, `${m.from.join(" + ") || "nobody"} → ${m.to || "nobody"}`),
      el("td", {}, m.gap_ms ? fmtMs(m.gap_ms) : "–"),
      el("td", {}, m.overlap_ms ? `${fmtMs(m.overlap_ms)}${m.overlap_ongoing ? " (ongoing)" : ""}` : "–"),
      m.duplicates === null
        ? el("td", { class: "muted", title: "a peer (ali-ons, the C++ client) reports no consumed offsets" }, "not measured")
        : el("td", { class: m.duplicates ? "hot" : "" }, fmt(m.duplicates)),
      el("td", {}, m.lag_spike === null || m.lag_spike === undefined ? "–" : `+${fmt(m.lag_spike)} (${fmt(m.lag_before)} → ${fmt(m.lag_peak)})`)));
    const table = el("table", { class: "handoff-moves" },
      el("thead", {}, el("tr", {}, ["queue", "from → to", "gap", "overlap", "consumed twice", "lag spike"].map((h) => el("th", { scope: "col" }, h)))),
      el("tbody", {}, rows));
    return [head, why, el("div", { class: "handoff-scroll" }, table)];
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
        showError(data.error || `${response.status} ${response.statusText}`, control);
        scheduleRender();
        return null;
      }
      hideError(control);
      applySnapshot(data.state || data);   // every action answers with the new state
      return data;
    } catch (err) {
      showError(`Request failed: ${err.message}`, control);
      return null;
    } finally {
      if (control) {
        control.disabled = false;
        delete control.dataset.busy;
      }
      scheduleRender();
    }
  }

  // A control's error is written next to it (the row it sits in), where the user looks;
  // only errors of no control (a failed fetch of the page's own) go to the box at the top.
  const errorBox = document.getElementById("lab-error");
  const ERROR_HOME = ".control, .group-head, .strategy-preview, .rebalance-strip";
  function errorSlot(control, create) {
    const home = control && control.isConnected ? control.closest(ERROR_HOME) : null;
    if (!home) return null;
    let slot = home.querySelector(':scope > [data-role="control-error"]');
    if (!slot && create) {
      slot = el("span", { class: "control-error", "data-role": "control-error", role: "alert" });
      home.append(slot);
    }
    return slot;
  }
  function showError(message, control) {
    const slot = errorSlot(control, true);
    if (slot) {
      slot.textContent = message;
      slot.hidden = false;
      return;
    }
    errorBox.querySelector(".message").textContent = message;
    errorBox.hidden = false;
  }
  function hideError(control) {
    const slot = errorSlot(control, false);
    if (slot) slot.remove();
    errorBox.hidden = true;
  }
  errorBox.querySelector(".dismiss").addEventListener("click", hideError);

  if (canControl) {
    const producerForm = document.getElementById("producer-form");
    producerForm.querySelector(".topic-select").addEventListener("change", updateProducerRate);
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
