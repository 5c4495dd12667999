// A control's error is written next to it (the row it sits in), where the user looks;
// only errors of no control (a failed fetch of the page's own) go to the box at the top.
import { el } from "../common/dom.js";

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

export function showError(message, control) {
  const slot = errorSlot(control, true);
  if (slot) {
    slot.textContent = message;
    slot.hidden = false;
    return;
  }
  errorBox.querySelector(".message").textContent = message;
  errorBox.hidden = false;
}

export function hideError(control) {
  const slot = errorSlot(control, false);
  if (slot) slot.remove();
  errorBox.hidden = true;
}

errorBox.querySelector(".dismiss").addEventListener("click", () => hideError());
