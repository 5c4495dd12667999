// What the page's HTML (templates/live.html) tells the scripts.
const root = document.getElementById("lab");

export const canControl = root.dataset.canControl === "1";
export const STRATEGIES = root.dataset.strategies.split(",");
export const MODES = root.dataset.modes.split(",");
// action -> one line on what it does (consumers_app/lab/actions.py)
export const ACTIONS = JSON.parse(document.getElementById("consumer-actions").textContent);
// "ours", then the other RocketMQ clients installed here (ali-ons...), which join over remoting.
export const CLIENTS = JSON.parse(document.getElementById("lab-clients").textContent);
