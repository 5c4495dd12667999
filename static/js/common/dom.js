// Building elements, and writers that touch the DOM only when the value differs: the live
// views call them every frame, and an unchanged cell must cost no style recalculation
// (nor a mutation record).

// el("td", {class: "cell", "data-queue": label, onclick: fn}, ...children); false/null/undefined attributes and children are left out.
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "style") node.style.cssText = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined && child !== false) node.append(child);
  }
  return node;
}

export function setData(node, key, value) { if (node.dataset[key] !== value) node.dataset[key] = value; }
export function setText(node, text) { if (node.textContent !== text) node.textContent = text; }
export function setAttr(node, name, value) { if (node.getAttribute(name) !== value) node.setAttribute(name, value); }
export function setClassName(node, value) { if (node.className !== value) node.className = value; }
export function setClass(node, name, on) { if (node.classList.contains(name) !== on) node.classList.toggle(name, on); }
// An attribute, not a class: the views rewrite their cells' className as they paint.
export function setMark(node, on) { if (node.hasAttribute("data-would-move") !== on) node.toggleAttribute("data-would-move", on); }
export function setStyle(node, css) {
  // The browser rewrites cssText in its own form, so compare with what we wrote last.
  if (node.writtenStyle === css) return;
  node.writtenStyle = css;
  node.style.cssText = css;
}
// A line that says `text`, hidden while there is nothing to say.
export function setLine(node, text) {
  setText(node, text);
  if (node.hidden !== !text) node.hidden = !text;
}

// An input shows the value in force (`value`, about `about`: a topic, a consumer): set
// again whenever that value changes or the thing it is about does. What the user types is
// theirs until they send it (forgetEdits) or pick another thing: a new value in force must
// not replace it between their typing and their click on the button.
export function showInForce(input, value, about) {
  if (!input || value === undefined || value === null) return;
  if (!input.followsEdits) {
    input.followsEdits = true;
    input.addEventListener("input", () => { input.dataset.edited = input.about; });
  }
  input.about = String(about);
  const stamp = `${about}|${value}`;
  if (input.dataset.edited === input.about || document.activeElement === input) return;
  delete input.dataset.edited;
  if (input.dataset.inForce === stamp) return;
  input.dataset.inForce = stamp;
  input.value = String(value);
}

// The inputs under `root` show the values in force again (their edits were sent).
export function forgetEdits(root) {
  for (const input of root.querySelectorAll("[data-edited]")) {
    delete input.dataset.edited;
    delete input.dataset.inForce;   // written again on the next render, even if unchanged
  }
}
