// nbresponses live Responses view (anywidget front end).
import { createStore, touchedItems } from "./state.js";
import { h, genericJson, syncChildren } from "./dom.js";
import { renderItem, itemDone } from "./items.js";
import { statusOf, usageFacts } from "./format.js";
import { hasLogprobs, legend, fillTip, backgroundOf } from "./heatmap.js";

function mount(model, el) {
  const ui = { open: {}, heat: false, pinned: null, streams: new Map() };
  const root = h("div", { class: "nbr-root" });
  const head = h("div", { class: "nbr-head" });
  const items = h("div", { class: "nbr-items" });
  const extra = h("div", { class: "nbr-extra" });
  const foot = h("div", { class: "nbr-foot" });
  const tip = h("div", { class: "nbr-tip", role: "tooltip", hidden: true });
  root.append(head, items, extra, foot, tip);
  el.replaceChildren(root);

  let frame = null;
  let dirty = null; // null: everything
  let cancelling = false;
  const itemEls = [];

  const store = createStore(model, (ops) => {
    const touched = ops ? touchedItems(ops) : null;
    if (touched === null) dirty = null;
    else if (dirty !== null) for (const i of touched) dirty.add(i);
    if (frame === null) frame = requestAnimationFrame(draw);
  });

  let headKey = null;

  function drawHead(state) {
    const status = statusOf(state);
    const live = state.view.phase !== "done";
    // Rebuilt only when it changes: replacing the buttons on every frame loses a press held
    // as long as people hold one (the mouseup lands on a new element, so no click).
    const key = JSON.stringify([status.key, status.label, live, state.response.model || "", hasLogprobs(state), ui.heat, Boolean(state.view.cancellable), cancelling]);
    if (key === headKey) return;
    headKey = key;
    const children = [
      h("span", { class: `nbr-status nbr-s-${status.key}`, "data-status": status.key }, live && status.key !== "queued" ? h("span", { class: "nbr-dot", "aria-hidden": "true" }) : null, status.label),
    ];
    if (state.response.model) children.push(h("span", { class: "nbr-model" }, String(state.response.model)));
    children.push(h("span", { class: "nbr-spacer" }));
    if (hasLogprobs(state)) {
      children.push(
        h("button", { class: "nbr-button nbr-heat-toggle", type: "button", "aria-pressed": ui.heat ? "true" : "false", title: "Colour each token by its probability", onclick: () => { ui.heat = !ui.heat; hideTip(true); redrawAll(); } }, ui.heat ? "Hide token probabilities" : "Token probabilities"),
      );
    }
    if (state.view.cancellable && live) {
      children.push(
        h("button", { class: "nbr-button nbr-cancel", type: "button", disabled: cancelling, onclick: () => { cancelling = true; model.send({ kind: "cancel" }); redrawAll(); } }, cancelling ? "Cancelling…" : "Cancel"),
      );
    }
    head.replaceChildren(...children);
  }

  function drawExtra(state) {
    const blocks = [];
    if (ui.heat) blocks.push(legend());
    const errors = [...(state.response.error ? [state.response.error] : []), ...(state.view.errors || [])];
    const seen = new Set();
    for (const err of errors) {
      if (!err || typeof err !== "object") continue;
      const text = `${err.code || "error"}: ${err.message || ""}`;
      if (seen.has(text)) continue;
      seen.add(text);
      blocks.push(h("div", { class: "nbr-error" }, text));
    }
    if (state.view.exception) blocks.push(h("div", { class: "nbr-error" }, `${state.view.exception.type}: ${state.view.exception.message}`));
    if (state.view.interrupted && state.view.phase === "done" && !state.view.exception) {
      blocks.push(h("div", { class: "nbr-warn" }, "The stream ended before the response was complete."));
    }
    if (state.response.status === "incomplete" && state.response.incomplete_details) {
      blocks.push(h("div", { class: "nbr-warn" }, `Incomplete: ${state.response.incomplete_details.reason || "unknown reason"}`));
    }
    if (state.view.unknown_count) {
      const list = (state.view.unknown || []).map((u) => h("div", { class: "nbr-unknown" }, h("code", {}, u.type), h("span", { class: "nbr-muted" }, ` ${u.reason}`), h("pre", { class: "nbr-json" }, u.data)));
      blocks.push(h("details", { class: "nbr-unknown-list" }, h("summary", {}, `${state.view.unknown_count} event(s) shown as they came (not recognised)`), list));
    }
    extra.replaceChildren(...blocks);
  }

  function drawFoot(state) {
    const facts = usageFacts(state);
    foot.replaceChildren(...facts.map(([label, value]) => h("span", { class: "nbr-fact" }, h("span", { class: "nbr-muted" }, `${label} `), value)));
    foot.hidden = facts.length === 0;
  }

  function draw() {
    frame = null;
    const state = store.state;
    if (!state) return;
    let background = null; // read once a frame, when a heat map needs it
    const ctx = { state, ui, background: () => (background ||= backgroundOf(root)) };
    const output = state.response.output || [];
    const metas = state.view.items || [];
    while (itemEls.length > output.length) itemEls.pop().remove();
    for (let i = 0; i < output.length; i++) {
      const item = output[i];
      let slot = itemEls[i];
      if (!slot) {
        slot = h("div", { class: "nbr-item", "data-index": i });
        items.append(slot);
        itemEls.push(slot);
      }
      const live = item && !itemDone(ctx, item, metas[i]);
      if (dirty === null || dirty.has(i) || live || slot.dataset.live === "1") {
        const rendered = renderItem(ctx, item, metas[i], i);
        slot.dataset.type = item && item.type ? String(item.type) : "";
        slot.dataset.live = live ? "1" : "0";
        syncChildren(slot, rendered ? [rendered] : []);
        slot.hidden = !rendered;
      }
    }
    if (!output.some(Boolean) && state.view.phase !== "done" && !items.querySelector(".nbr-waiting")) {
      items.append(h("div", { class: "nbr-muted nbr-waiting" }, "Waiting for the first event…"));
    } else if (output.some(Boolean)) {
      for (const w of items.querySelectorAll(".nbr-waiting")) w.remove();
    }
    drawHead(state);
    drawExtra(state);
    drawFoot(state);
    dirty = new Set();
  }

  function redrawAll() {
    dirty = null;
    if (frame === null) frame = requestAnimationFrame(draw);
  }

  // Token popover: hover shows it, click pins it, a click elsewhere or Escape hides it.
  function tokenAt(target) {
    const span = target && target.closest ? target.closest(".nbr-token") : null;
    if (!span) return null;
    const slot = span.closest(".nbr-item");
    const partEl = span.closest(".nbr-tokens");
    const index = Number(slot.dataset.index);
    const parts = [...slot.querySelectorAll(".nbr-tokens")];
    const item = store.state.response.output[index];
    const textParts = (item.content || []).filter((p) => p && Array.isArray(p.logprobs) && p.logprobs.length);
    const part = textParts[parts.indexOf(partEl)];
    return part ? { span, lp: part.logprobs[Number(span.dataset.i)] } : null;
  }
  function showTip(found) {
    fillTip(tip, found.lp, backgroundOf(tip));
    tip.hidden = false;
    placeTip(found.span);
    for (const el of root.querySelectorAll(".nbr-token-active")) el.classList.remove("nbr-token-active");
    found.span.classList.add("nbr-token-active");
  }
  // The popover is fixed, not placed in the view: output areas hide what overflows them, so on
  // a one- or two-line answer an absolutely placed popover lost its lower rows. A fixed box is
  // placed (and clipped) by the window, or by the nearest ancestor with a transform, a filter
  // or containment (JupyterLab's notebook has `contain: strict`): the popover goes below its
  // token when it fits in what that leaves visible, else above, else on the roomier side.
  function fixedFrame(el) {
    for (let node = el.parentElement; node && node !== document.documentElement; node = node.parentElement) {
      const s = getComputedStyle(node);
      if (s.transform !== "none" || s.perspective !== "none" || s.filter !== "none" ||
          /paint|layout|strict|content/.test(s.contain) || /transform|perspective|filter/.test(s.willChange)) {
        return node;
      }
    }
    return null;
  }
  function placeTip(span) {
    const at = span.getBoundingClientRect();
    const frame = fixedFrame(tip);
    const box = { top: 0, bottom: window.innerHeight, left: 0, right: window.innerWidth };
    if (frame) {
      const r = frame.getBoundingClientRect();
      Object.assign(box, {
        top: Math.max(box.top, r.top), bottom: Math.min(box.bottom, r.bottom),
        left: Math.max(box.left, r.left), right: Math.min(box.right, r.right),
      });
    }
    const width = tip.offsetWidth;
    const height = tip.offsetHeight;
    const x = Math.max(box.left + 4, Math.min(at.left, box.right - width - 4));
    const room = { below: box.bottom - at.bottom - 4, above: at.top - box.top - 4 };
    const below = room.below >= height || (room.above < height && room.below >= room.above);
    const y = below ? at.bottom + 4 : at.top - height - 4;
    tip.style.left = `${x}px`;
    tip.style.top = `${y}px`;
    const got = tip.getBoundingClientRect(); // window coordinates; the frame may shift them
    tip.style.left = `${2 * x - got.left}px`;
    tip.style.top = `${2 * y - got.top}px`;
  }
  function onScroll() {
    if (tip.hidden) return;
    if (ui.pinned && ui.pinned.isConnected) placeTip(ui.pinned); // follows its token
    else hideTip(true);
  }
  window.addEventListener("scroll", onScroll, { capture: true, passive: true });
  function hideTip(force) {
    if (ui.pinned && !force) return;
    ui.pinned = null;
    tip.hidden = true;
    for (const el of root.querySelectorAll(".nbr-token-active")) el.classList.remove("nbr-token-active");
  }
  root.addEventListener("mouseover", (event) => {
    if (ui.pinned) return;
    const found = tokenAt(event.target);
    if (found) showTip(found);
  });
  root.addEventListener("mouseout", (event) => {
    if (!ui.pinned && tokenAt(event.target) && !tokenAt(event.relatedTarget)) hideTip(false);
  });
  root.addEventListener("click", (event) => {
    const found = tokenAt(event.target);
    if (found) {
      ui.pinned = found.span;
      showTip(found);
    } else if (!tip.contains(event.target)) {
      hideTip(true);
    }
  });
  root.addEventListener("keydown", (event) => {
    if (event.key === "Escape") hideTip(true);
  });

  // for debugging and tests: the element's current copy of the state
  Object.defineProperty(root, "nbrState", { get: () => store.state });
  draw();
  return () => {
    if (frame !== null) cancelAnimationFrame(frame);
    window.removeEventListener("scroll", onScroll, { capture: true });
    store.dispose();
  };
}

export default {
  render({ model, el }) {
    try {
      return mount(model, el);
    } catch (err) {
      el.replaceChildren(h("div", { class: "nbr-error" }, `nbresponses view failed: ${err.message}`), genericJson(model.get("_snapshot")));
      return undefined;
    }
  },
};
