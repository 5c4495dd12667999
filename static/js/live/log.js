// The "Membership & faults" log: the model's log lines, newest first.
import { el } from "../common/dom.js";
import { clock } from "../common/format.js";
import { lab } from "./model.js";

let shown = -1;

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

export function renderLog() {
  if (shown === lab.logVersion) return;
  shown = lab.logVersion;
  const list = document.getElementById("membership-log");
  list.replaceChildren(...lab.log.slice().reverse().map((e) => el("li", { class: `log-${e.type}`, "data-type": e.type, "data-client": e.client_id || "" },
    el("time", {}, clock(e.ts)), " ", el("span", { class: "log-group" }, e.group || "lab"), " ", describe(e))));
}
