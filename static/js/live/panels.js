// The page's status lines around the groups: the broker process banner, the attached
// cluster's note (and the controls it disables), disk use and the history service's cost.
import { setLine, setText } from "../common/dom.js";
import { MIB } from "../common/format.js";
import { lab } from "./model.js";

let statusShown = -1, clusterShown = -1;

// Called on every render; writes only when a snapshot (or a broker process event) came.
export function showPanels() {
  if (clusterShown !== lab.clusterVersion) {
    clusterShown = lab.clusterVersion;
    showCluster(lab.cluster);
  }
  if (statusShown === lab.statusVersion) return;
  statusShown = lab.statusVersion;
  if (lab.brokerProcess) showBrokerProcess(lab.brokerProcess);
  if (lab.disk) showDiskUse(lab.disk);
  showHistoryService(lab.historyService);
}

// Bytes on disk per part, as the controller measures them every 10 s; a part the lab
// cannot see (someone else's broker) is not in the snapshot and not on the line.
const DISK_PARTS = [["commitlog", "commit log"], ["consumequeue", "consume queues"], ["recordings", "recordings"],
                    ["lag_history", "history"], ["database", "db"]];
function showDiskUse(disk) {
  const mib = (bytes) => (bytes > 0 && bytes < MIB ? "< 1 MiB" : `${Math.round(bytes / MIB)} MiB`);
  const parts = DISK_PARTS.filter(([key]) => key in disk).map(([key, name]) => {
    const budget = disk.budget && disk.budget[key];
    return `${name} ${mib(disk[key])}${budget ? ` of ${Math.round(budget / MIB)}` : ""}`;
  });
  setLine(document.getElementById("disk-use"), parts.length ? `disk: ${parts.join(" · ")}` : "");
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
  setLine(line, text);
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
export const disabledReason = (control) => (lab.cluster.disabled || {})[control] || "";

function showCluster(cluster) {
  const note = document.getElementById("cluster-note");
  if (note) {
    note.hidden = !cluster.attached;
    const reasons = Object.values(cluster.disabled || {});
    setText(note, cluster.attached
      ? `Attached to the cluster at ${cluster.namesrv}.${reasons.length ? ` Disabled: ${reasons.join("; ")}.` : ""}` : "");
  }
  disableClusterControls(document);
}

// The controls under `root` the attached cluster disables (a new group card's too).
export function disableClusterControls(root) {
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
