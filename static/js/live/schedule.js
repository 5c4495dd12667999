// One repaint per animation frame however many frames arrive: whatever changes the state
// asks for a render, and the page's render (lab.js registers it) runs once in the next frame.
let render = () => {};
let pending = false;

export function onRender(fn) { render = fn; }

export function scheduleRender() {
  if (pending) return;
  pending = true;
  requestAnimationFrame(() => {
    pending = false;
    render();
  });
}
