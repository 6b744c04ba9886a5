// Small inline SVG icons (our own markup, not model output) so that no icon depends on the
// fonts installed on the reader's machine.
const PATHS = {
  function: "M9 3.5c-1.6 0-2.3 1-2.6 2.6L6 8H4.5v1.5h1.2l-.9 4.6c-.2.9-.5 1.2-1.1 1.2H3V17h.9c1.6 0 2.3-1 2.6-2.6l1-4.9H9V8H7.8l.3-1.5c.2-.9.5-1.2 1.1-1.2h.8V3.5zM11 9l1.8 2.5L11 14h1.7l1-1.5 1 1.5h1.8l-1.9-2.5L16.4 9h-1.7l-1 1.4-1-1.4z",
  code: "M7.4 5.6 2.9 10l4.5 4.4 1.1-1.1L5.1 10l3.4-3.3zm5.2 0-1.1 1.1 3.4 3.3-3.4 3.3 1.1 1.1 4.5-4.4z",
  search: "M8.5 3a5.5 5.5 0 0 1 4.4 8.8l4 4-1.1 1.1-4-4A5.5 5.5 0 1 1 8.5 3zm0 1.5a4 4 0 1 0 0 8 4 4 0 0 0 0-8z",
  item: "M10 3 17 10 10 17 3 10z",
};

export function icon(name) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", "0 0 20 20");
  svg.setAttribute("width", "14");
  svg.setAttribute("height", "14");
  svg.setAttribute("aria-hidden", "true");
  svg.setAttribute("class", "nbr-icon");
  const path = document.createElementNS(ns, "path");
  path.setAttribute("d", PATHS[name] || PATHS.item);
  path.setAttribute("fill", "currentColor");
  svg.append(path);
  return svg;
}

export function spinner() {
  const el = document.createElement("span");
  el.className = "nbr-spinner";
  el.setAttribute("aria-hidden", "true");
  return el;
}
