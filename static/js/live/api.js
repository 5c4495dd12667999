// The one way the page talks to the JSON API (dashboard/api.py): every answer, good or
// bad, comes back as {ok, status, data, error, retryAfter}; nothing throws.
//
// The API answers JSON even when it refuses: {"error": why}. A 429 (too many control
// requests) or 503 (no controller, or it is busy) means nothing was applied, and says
// when to try again (Retry-After, seconds).

const csrfToken = () => document.querySelector('meta[name="csrf-token"]')?.content || "";

export const isRetryLater = (status) => status === 429 || status === 503;

// GET without a body; POST (JSON, with the CSRF token) with one.
export async function request(url, body) {
  const init = { credentials: "same-origin", headers: { Accept: "application/json" } };
  if (body !== undefined) {
    Object.assign(init, { method: "POST", body: JSON.stringify(body) });
    Object.assign(init.headers, { "Content-Type": "application/json", "X-CSRFToken": csrfToken() });
  }
  let response;
  try {
    response = await fetch(url, init);
  } catch (err) {
    return { ok: false, status: 0, data: null, error: `Request failed: ${err.message}`, retryAfter: null };
  }
  const data = await response.json().catch(() => null);
  const retryAfter = isRetryLater(response.status) ? Number(response.headers.get("Retry-After")) || 1 : null;
  const ok = response.ok && data !== null;
  const error = ok ? null : (data && data.error) || `${response.status} ${response.statusText}`;
  return { ok, status: response.status, data, error, retryAfter };
}
