// Token probability heat map: every token coloured on the viridis scale (perceptually
// uniform and colour-blind safe), with a popover listing the top alternatives.

const VIRIDIS = [
  [68, 1, 84], [72, 36, 117], [65, 68, 135], [53, 95, 141], [42, 120, 142], [33, 145, 140],
  [34, 168, 132], [68, 191, 112], [122, 209, 81], [189, 223, 38], [253, 231, 37],
];

export function viridis(p) {
  const x = Math.min(1, Math.max(0, Number.isFinite(p) ? p : 0)) * (VIRIDIS.length - 1);
  const i = Math.min(VIRIDIS.length - 2, Math.floor(x));
  const t = x - i;
  const [a, b] = [VIRIDIS[i], VIRIDIS[i + 1]];
  return a.map((v, k) => Math.round(v + (b[k] - v) * t));
}

const rgb = (c) => `rgb(${c[0]}, ${c[1]}, ${c[2]})`;
export function luminance([r, g, b]) {
  const lin = (v) => ((v /= 255) <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4);
  return 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b);
}
// WCAG contrast ratio of two colours
export function contrast(a, b) {
  const [x, y] = [luminance(a), luminance(b)];
  return (Math.max(x, y) + 0.05) / (Math.min(x, y) + 0.05);
}
// Black or white, whichever reads better on `colour` (at least 4.58:1 on any colour).
const ink = (colour) => (luminance(colour) > 0.179 ? "#000" : "#fff");
// A colour drawn on `background` that would nearly vanish into it (under 3:1, the WCAG
// minimum for graphics) gets an edge in the muted text colour.
const EDGE = 3;
// The colour a view is drawn on, as [r, g, b] (a transparent one is taken as white).
export function backgroundOf(el) {
  for (let node = el; node && node.nodeType === 1; node = node.parentElement) {
    const m = /rgba?\(([\d.]+),\s*([\d.]+),\s*([\d.]+)(?:,\s*([\d.]+))?/.exec(getComputedStyle(node).backgroundColor);
    if (m && (m[4] === undefined || Number(m[4]) > 0.5)) return [Number(m[1]), Number(m[2]), Number(m[3])];
  }
  return [255, 255, 255];
}
export const probability = (logprob) => {
  const x = Number(logprob);
  return Number.isFinite(x) ? Math.min(1, Math.exp(x)) : 0;
};
const visible = (token) => JSON.stringify(String(token ?? "")).slice(1, -1);
const percent = (p) => `${(p * 100).toFixed(p >= 0.995 || p < 0.001 ? 2 : 1)}%`;

export function hasLogprobs(state) {
  return (state.response.output || []).some(
    (item) => item && item.type === "message" && (item.content || []).some((part) => part && Array.isArray(part.logprobs) && part.logprobs.length),
  );
}

// One token of the heat map; unlikely tokens that would vanish into `background` get an edge
// (likely ones are the unremarkable majority and stay plain).
export function tokenSpan(lp, i, background) {
  const span = document.createElement("span");
  const p = probability(lp && lp.logprob);
  const colour = viridis(p);
  span.className = p < 0.5 && contrast(colour, background) < EDGE ? "nbr-token nbr-edge" : "nbr-token";
  span.dataset.i = String(i);
  span.style.backgroundColor = rgb(colour);
  span.style.color = ink(colour);
  span.textContent = String((lp && lp.token) ?? "");
  return span;
}

export function legend() {
  const el = document.createElement("div");
  el.className = "nbr-legend";
  const bar = document.createElement("span");
  bar.className = "nbr-legend-bar";
  bar.style.background = `linear-gradient(to right, ${VIRIDIS.map(rgb).join(", ")})`;
  const lo = document.createElement("span");
  lo.textContent = "p = 0";
  const hi = document.createElement("span");
  hi.textContent = "1";
  el.append(lo, bar, hi);
  return el;
}

// The popover for token `lp` (an output_text logprob entry).
export function fillTip(tip, lp, background) {
  tip.replaceChildren();
  const p = probability(lp.logprob);
  const head = document.createElement("div");
  head.className = "nbr-tip-head";
  const tok = document.createElement("code");
  tok.textContent = visible(lp.token);
  head.append(tok, ` ${percent(p)} · logprob ${Number(lp.logprob).toFixed(3)}`);
  tip.append(head);
  const alternatives = Array.isArray(lp.top_logprobs) ? lp.top_logprobs : [];
  if (!alternatives.length) return;
  const table = document.createElement("table");
  for (const alt of alternatives) {
    const q = probability(alt.logprob);
    const row = table.insertRow();
    if (alt.token === lp.token) row.className = "nbr-tip-chosen";
    const name = document.createElement("code");
    name.textContent = visible(alt.token);
    row.insertCell().append(name);
    const bar = document.createElement("span");
    const colour = viridis(q);
    bar.className = contrast(colour, background) < EDGE ? "nbr-tip-bar nbr-edge" : "nbr-tip-bar";
    bar.style.width = `${Math.max(4, Math.round(q * 80))}px`;
    bar.style.backgroundColor = rgb(colour);
    row.insertCell().append(bar);
    row.insertCell().textContent = percent(q);
  }
  tip.append(table);
}
