// A lab action: POST it, and take the answer as the new state (every action answers with
// a snapshot) or show its error next to the control that asked.
import { request } from "./api.js";
import { showError, hideError } from "./errors.js";
import { lab, applySnapshot } from "./model.js";
import { scheduleRender } from "./schedule.js";

// The control is disabled (and marked busy) while its request is in flight. Returns the
// answer, or null when it failed.
export async function callApi(url, body, control) {
  if (control) {
    control.disabled = true;
    control.dataset.busy = "1";
  }
  try {
    const answer = await request(url, body);
    if (!answer.ok) {
      showError(answer.error || `${answer.status}`, control);
      return null;
    }
    hideError(control);
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
