// The lab's own controls (shown to a user who may steer it): producer rate and bursts,
// queues per topic, new consumers and groups, observing a group, brokers on and offline.
import { el, setText, showInForce } from "../common/dom.js";
import { fmt, javaOrder } from "../common/format.js";
import { callApi } from "./actions.js";
import { canControl } from "./config.js";
import { numberIn, showError } from "./errors.js";
import { lab } from "./model.js";
import { disabledReason } from "./panels.js";
import { labTopic, userTopics } from "./queues.js";

export function renderLabControls() {
  if (!canControl) return;
  const brokerNames = Object.keys(lab.brokers).sort(javaOrder);
  // The user's topics only: a group's %RETRY% and %DLQ% topics are the broker's, never a
  // target of a rate, a burst or a queue change (and sort first in Java's order). A menu
  // starts on the lab's topic, and keeps the user's pick while it exists.
  const topics = userTopics(Object.keys(lab.topics), brokerNames);
  for (const select of document.querySelectorAll(".topic-select")) {
    const values = [...select.options].map((o) => o.value).join(",");
    if (values !== topics.join(",")) {
      const keep = select.dataset.picked;
      select.replaceChildren(...topics.map((t) => el("option", { value: t }, t)));
      select.value = topics.includes(keep) ? keep : labTopic(topics, lab.producers, lab.groups);
    }
  }
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

// The rate input and the "now N msg/s" beside it follow the picked topic's producer.
function updateProducerRate() {
  const topic = document.querySelector("#producer-form .topic-select").value;
  const producer = lab.producers[topic];
  showInForce(document.querySelector('#producer-form input[name="rate"]'), producer ? producer.rate : 0, topic);
  setText(document.getElementById("producer-rate"), producer && producer.rate !== undefined ? `now ${fmt(producer.rate)} msg/s` : "");
}

// The forms' submits become API calls (the forms never post themselves).
export function listenToLabControls() {
  if (!canControl) return;
  const producerForm = document.getElementById("producer-form");
  producerForm.querySelector(".topic-select").addEventListener("change", updateProducerRate);
  for (const select of document.querySelectorAll(".topic-select")) {
    select.addEventListener("change", () => { select.dataset.picked = select.value; });   // the user's pick stays
  }
  producerForm.addEventListener("submit", (event) => {
    event.preventDefault();
    const topic = new FormData(producerForm).get("topic");
    if (event.submitter.dataset.api === "burst") {
      const count = numberIn(producerForm.elements.count, "how many messages to send", event.submitter);
      if (count !== null) callApi("/api/producers/burst", { topic, count }, event.submitter);
    } else {
      const rate = numberIn(producerForm.elements.rate, "a rate in messages per second", event.submitter);
      if (rate !== null) callApi("/api/producers/rate", { topic, rate }, event.submitter);
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
    const group = groupName(groupForm, event.submitter);
    if (group) callApi(`/api/groups/${encodeURIComponent(group)}/consumers`, { mode: f.get("mode"), client: f.get("client") || "ours" }, event.submitter);
  });
  const observeForm = document.getElementById("observe-form");
  observeForm.addEventListener("submit", (event) => {
    event.preventDefault();
    const group = groupName(observeForm, event.submitter);
    if (group) callApi("/api/observe", { group }, event.submitter);
  });
}

// A form's group name, or null (said next to the button) when the box is empty; the server
// checks the rest and names the rule broken (consumers_app/lab/actions.py).
function groupName(form, submitter) {
  const name = form.elements.group.value.trim();
  if (!name) showError(`Enter a group name (1 to ${form.elements.group.dataset.maxChars || 120} characters).`, submitter);
  return name || null;
}
