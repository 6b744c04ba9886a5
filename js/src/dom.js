// A tiny element builder: text children become text nodes, never HTML.
export function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value == null || value === false) continue;
    if (key === "class") el.className = value;
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child == null || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

export function safeLink(url, label) {
  const text = String(label || url || "");
  if (typeof url !== "string" || !/^https?:\/\//i.test(url)) return h("span", {}, text);
  return h("a", { href: url, target: "_blank", rel: "noopener noreferrer", title: url }, text);
}

const MAX_STRING = 400;
// JSON for anything the view does not know, with long strings (encrypted content, base64) cut.
export function genericJson(value) {
  const text = JSON.stringify(
    value,
    (_key, v) => (typeof v === "string" && v.length > MAX_STRING ? `${v.slice(0, MAX_STRING)}… (${v.length} chars)` : v),
    2,
  );
  return h("pre", { class: "nbr-json" }, text ?? String(value));
}

// Make `nodes` the children of `parent`, leaving in place those already there: a node taken
// out and put back loses its layout, and a long answer's costs its whole length to redo.
export function syncChildren(parent, nodes) {
  let i = 0;
  for (; i < nodes.length; i++) {
    const at = parent.childNodes[i];
    if (at !== nodes[i]) parent.insertBefore(nodes[i], at || null);
  }
  while (parent.childNodes.length > nodes.length) parent.lastChild.remove();
}
