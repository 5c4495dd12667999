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

// Stays until the next action on that control (callApi clears it as it sends): a newer
// error replaces it as a new element, so a repeated refusal is seen (and announced) again.
export function showError(message, control) {
  errorSlot(control, false)?.remove();
  const slot = errorSlot(control, true);
  if (slot) {
    slot.textContent = message;
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

// A number box's value, or null (and the reason next to `control`) when it is empty or
// unreadable: the page never sends 0 for an empty box. A value out of range goes to the
// server, whose answer names the limit.
export function numberIn(input, what, control) {
  if (input.value !== "" && !input.validity.badInput) return Number(input.value);
  const range = input.max ? ` from ${input.min || 0} to ${input.max}` : input.min ? ` of ${input.min} or more` : "";
  showError(`Enter ${what}: a number${range}.`, control);
  return null;
}
