// The live websocket (dashboard/consumers.py): a snapshot, then one event per frame;
// reconnects with a growing pause (500 ms up to 10 s) whenever it closes.
const status = document.getElementById("ws-status");

function setStatus(state, text) {
  status.dataset.state = state;
  status.textContent = text;
}

// onFrame(frame) for each frame, parsed.
export function connectLab(onFrame) {
  let retryMs = 500;

  function connect() {
    const ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws/lab/`);
    let received = 0, acked = 0;
    // Tell the server how far we got, so a page that cannot keep up gets a fresh
    // snapshot instead of an ever-growing backlog.
    const acker = setInterval(() => {
      if (ws.readyState === WebSocket.OPEN && received !== acked) {
        acked = received;
        ws.send(JSON.stringify({ type: "ack", received }));
      }
    }, 250);
    ws.onopen = () => { retryMs = 500; setStatus("live", "live"); };
    // A handler property, not addEventListener: bench/page_render.py wraps this setter to time frames.
    ws.onmessage = (message) => {
      received += 1;
      onFrame(JSON.parse(message.data));
    };
    ws.onclose = (event) => {
      clearInterval(acker);
      setStatus("down", event.code === 4503 ? "lab unavailable, retrying…" : "disconnected, retrying…");
      setTimeout(connect, retryMs);
      retryMs = Math.min(retryMs * 2, 10000);
    };
  }

  connect();
}
