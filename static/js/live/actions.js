// A lab action: POST it, and take the answer as the new state (every action answers with
// a snapshot) or show its error next to the control that asked.
import { forgetEdits } from "../common/dom.js";
import { request } from "./api.js";
import { showError, hideError } from "./errors.js";
import { lab, applySnapshot } from "./model.js";
import { scheduleRender } from "./schedule.js";

// The control is disabled (and marked busy) while its request is in flight. Returns the
// answer, or null when it failed.
export async function callApi(url, body, control) {
  if (control) {
    hideError(control);   // the last answer's error goes as the next action starts
    control.disabled = true;
    control.dataset.busy = "1";
  }
  try {
    const answer = await request(url, body);
    if (!answer.ok) {
      showError(answer.error || `${answer.status}`, control);
      return null;
    }
    // Done: the boxes of the control's row show what is in force again (dom.js showInForce).
    if (control) forgetEdits(control.closest("form, .control") || control);
    applySnapshot(lab, answer.data.state || answer.data);
    return answer.data;
  } finally {
    if (control) {
      control.disabled = false;
      delete control.dataset.busy;
    }
    scheduleRender();
  }
}
