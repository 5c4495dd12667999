// The live page (templates/live.html), an ES module: state from the websocket (a
// snapshot, then one event per frame), drawn as one card per consumer group, plus the
// controls that call the JSON API. Its parts, one concern each, are under live/:
//
//   model.js      the page's state: snapshots and events folded into plain data (unit-tested)
//   queues.js     what that state says about queues and consumers (unit-tested)
//   lagseries.js  the last 5 minutes of lag per group (unit-tested)
//   socket.js     the websocket, acks and reconnects
//   api.js        every call of the JSON API; actions.js: an action whose answer is the new state
//   group-card.js a group's card; assignment.js picks its view: matrix.js (small) or grid.js (large)
//   whatif.js     the strategy preview;  lag.js: lag lines and replay;  handoffs.js: rebalances' hand-offs
//   charts.js     plotly charts;  log.js: membership & faults;  panels.js: status lines;  controls.js: lab controls
//   errors.js     a control's error, written next to it;  colours.js: a consumer's colour, given on first sight
//   labels.js     short client ids (the whole on hover);  ../common/clusters.js: close marks as one (unit-tested)
//
// Frames update the model and ask for a render; renders are throttled to one per
// animation frame, so a flood of events costs one repaint per frame budget.
import { renderGroups } from "./live/group-card.js";
import { scheduleCharts } from "./live/charts.js";
import { listenToLabControls, renderLabControls } from "./live/controls.js";
import { renderLog } from "./live/log.js";
import { lab, applyEvent, applySnapshot } from "./live/model.js";
import { showPanels } from "./live/panels.js";
import { onRender, scheduleRender } from "./live/schedule.js";
import { connectLab } from "./live/socket.js";

onRender(() => {
  showPanels();
  renderGroups();
  renderLog();
  renderLabControls();
  scheduleCharts();
});

listenToLabControls();

connectLab((frame) => {
  if (frame.type === "snapshot") applySnapshot(lab, frame);
  else applyEvent(lab, frame);
  scheduleRender();
});
