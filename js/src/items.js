// One renderer per output item type; anything unknown falls back to a generic JSON block.
import { h, safeLink, genericJson, syncChildren } from "./dom.js";
import { MarkdownStream, PlainStream, TokenStream, streamFor } from "./streaming.js";
import { fmtInt, fmtSeconds } from "./format.js";
import { icon, spinner } from "./icons.js";

const FINISHED = new Set(["completed", "incomplete", "failed", "cancelled"]);

export function itemDone(ctx, item, meta) {
  return ctx.state.view.phase === "done" || FINISHED.has(item.status) || (meta && meta.t1 != null);
}

function badge(status) {
  if (!status) return null;
  return h("span", { class: `nbr-badge nbr-s-${String(status).replace(/[^a-z_]/gi, "")}` }, String(status));
}

function header(name, title, ...rest) {
  return h("div", { class: "nbr-item-head" }, icon(name), h("span", { class: "nbr-item-title" }, title), ...rest);
}

function reasoning(ctx, item, meta, index) {
  const done = itemDone(ctx, item, meta);
  const key = item.id || `#${index}`;
  const summaries = (item.summary || []).filter((p) => p && p.text);
  const contents = (item.content || []).filter((p) => p && p.text);
  const t0 = meta && meta.t0;
  const t1 = meta && meta.t1;
  const elapsed = t0 == null ? null : (t1 != null ? t1 : ctx.state.view.timing.elapsed || t0) - t0;
  const usage = ctx.state.response.usage;
  const reasoningItems = (ctx.state.response.output || []).filter((it) => it && it.type === "reasoning").length;
  const usageTokens = usage && usage.output_tokens_details && usage.output_tokens_details.reasoning_tokens;
  const facts = [];
  if (elapsed != null && elapsed > 0) facts.push(fmtSeconds(elapsed));
  if (done && reasoningItems === 1 && Number.isInteger(usageTokens)) facts.push(`${fmtInt(usageTokens)} tokens`);
  else if (meta && meta.deltas) facts.push(`${fmtInt(meta.deltas)} deltas`);

  const title = done ? "Reasoning" : "Thinking…";
  const last = [...summaries, ...contents].pop();
  // the last line so far (from the end of the text: the whole of it may be long)
  const preview = !done && last ? last.text.slice(-2000).trim().split("\n").pop().slice(-120) : "";
  const summary = h(
    "summary",
    {},
    done ? null : spinner(),
    h("span", { class: "nbr-item-title" }, title),
    facts.length ? h("span", { class: "nbr-muted" }, ` · ${facts.join(" · ")}`) : null,
    preview ? h("span", { class: "nbr-preview" }, preview) : null,
  );
  // The body and the details stay the same elements from frame to frame (see syncChildren).
  const body = streamFor(ctx.ui, `${index}:body`, () => h("div", { class: "nbr-reasoning-body" }));
  const parts = [];
  (item.summary || []).forEach((part, i) => {
    if (part && part.text) parts.push(streamFor(ctx.ui, `${index}:s${i}`, () => new MarkdownStream()).update(part.text));
  });
  (item.content || []).forEach((part, i) => {
    if (part && part.text) parts.push(streamFor(ctx.ui, `${index}:r${i}`, () => new PlainStream()).update(part.text));
  });
  if (!parts.length) {
    parts.push(h("div", { class: "nbr-muted" }, item.encrypted_content ? "Encrypted reasoning (not readable)." : "No reasoning text."));
  }
  syncChildren(body, parts);
  const details = streamFor(ctx.ui, `${index}:details`, () => {
    const el = h("details", { class: "nbr-reasoning" });
    el.addEventListener("toggle", () => {
      ctx.ui.open[el.dataset.key] = el.open;
    });
    return el;
  });
  details.dataset.key = key;
  if (details.open !== Boolean(ctx.ui.open[key])) details.open = Boolean(ctx.ui.open[key]);
  syncChildren(details, [summary, body]);
  return details;
}

function annotations(list) {
  const links = [];
  for (const note of list || []) {
    if (!note || typeof note !== "object") continue;
    if (note.type === "url_citation") links.push(safeLink(note.url, note.title || note.url));
    else if (note.filename || note.file_id) links.push(h("span", { class: "nbr-file" }, `file: ${note.filename || note.file_id}`));
  }
  if (!links.length) return null;
  const seen = new Set();
  const unique = links.filter((el) => (seen.has(el.textContent) ? false : seen.add(el.textContent)));
  return h("div", { class: "nbr-sources" }, h("span", { class: "nbr-muted" }, "Sources: "), unique.flatMap((el, i) => (i ? [" · ", el] : [el])));
}

function message(ctx, item, meta, index) {
  const box = streamFor(ctx.ui, `${index}:message`, () => h("div", { class: "nbr-message" }));
  const children = [];
  if (item.phase) children.push(h("div", { class: "nbr-muted nbr-phase" }, String(item.phase)));
  (item.content || []).forEach((part, i) => {
    if (!part || typeof part !== "object") return;
    if (part.type === "refusal") {
      children.push(h("div", { class: "nbr-refusal" }, h("b", {}, "Refusal: "), part.refusal || ""));
    } else if (typeof part.text === "string") {
      const heat = ctx.ui.heat && Array.isArray(part.logprobs) && part.logprobs.length;
      const key = `${index}:c${i}`;
      children.push(
        heat
          ? streamFor(ctx.ui, `${key}:heat`, () => new TokenStream()).update(part.logprobs, ctx.background())
          : streamFor(ctx.ui, key, () => new MarkdownStream()).update(part.text),
      );
      const sources = annotations(part.annotations);
      if (sources) children.push(sources); // append(null) would add the text "null"
    } else {
      children.push(genericJson(part));
    }
  });
  syncChildren(box, children);
  return box;
}

function prettyJson(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return null;
  }
}

function functionCall(ctx, item, meta) {
  const done = itemDone(ctx, item, meta);
  const args = String(item.arguments ?? "");
  const pretty = done ? prettyJson(args) : null;
  const box = h(
    "div",
    { class: "nbr-tool nbr-function" },
    header("function", item.name || "function", item.call_id ? h("span", { class: "nbr-muted nbr-id" }, item.call_id) : null, badge(item.status || (done ? null : "in_progress"))),
    h("pre", { class: `nbr-code nbr-args${done ? "" : " nbr-streaming"}` }, pretty ?? args),
  );
  const output = (ctx.state.response.output || []).find((it) => it && it.type === "function_call_output" && it.call_id && it.call_id === item.call_id);
  if (output) box.append(h("div", { class: "nbr-muted" }, "output"), h("pre", { class: "nbr-code" }, typeof output.output === "string" ? output.output : JSON.stringify(output.output, null, 2)));
  return box;
}

function codeInterpreter(ctx, item, meta) {
  const done = itemDone(ctx, item, meta);
  const box = h(
    "div",
    { class: "nbr-tool nbr-code-interpreter" },
    header("code", "Code interpreter", badge(item.status)),
    h("pre", { class: `nbr-code${done ? "" : " nbr-streaming"}` }, String(item.code ?? "")),
  );
  for (const out of item.outputs || []) {
    if (!out || typeof out !== "object") continue;
    if (out.type === "logs") box.append(h("pre", { class: "nbr-code nbr-output" }, String(out.logs ?? "")));
    else if (out.type === "image") box.append(h("div", { class: "nbr-muted" }, "image output (not loaded): ", safeLink(out.url, out.url)));
    else box.append(genericJson(out));
  }
  return box;
}

function webSearch(ctx, item) {
  const action = item.action || {};
  const what = [];
  if (action.type === "search" || action.query) {
    const queries = action.queries || (action.query ? [action.query] : []);
    what.push(h("span", {}, queries.map((q) => `“${q}”`).join(", ")));
  } else if (action.type === "open_page") {
    what.push("open ", safeLink(action.url, action.url));
  } else if (action.type === "find") {
    what.push(`find “${action.pattern || ""}” in `, safeLink(action.url, action.url));
  }
  const box = h("div", { class: "nbr-tool nbr-web" }, header("search", "Web search", action.type ? h("span", { class: "nbr-muted" }, action.type) : null, badge(item.status)));
  if (what.length) box.append(h("div", { class: "nbr-web-what" }, what));
  const sources = (action.sources || []).filter((s) => s && s.url);
  if (sources.length) box.append(h("div", { class: "nbr-sources" }, h("span", { class: "nbr-muted" }, "Sources: "), sources.flatMap((s, i) => (i ? [" · ", safeLink(s.url, s.url)] : [safeLink(s.url, s.url)]))));
  return box;
}

function generic(ctx, item) {
  const rest = Object.fromEntries(Object.entries(item).filter(([k]) => !["type", "id", "status"].includes(k)));
  return h("div", { class: "nbr-tool nbr-generic" }, header("item", String(item.type || "item"), badge(item.status)), Object.keys(rest).length ? genericJson(rest) : null);
}

const RENDERERS = {
  reasoning,
  message,
  function_call: functionCall,
  code_interpreter_call: codeInterpreter,
  web_search_call: webSearch,
};

export function renderItem(ctx, item, meta, index) {
  if (!item || typeof item !== "object") return null;
  if (item.type === "function_call_output") {
    const shown = (ctx.state.response.output || []).some((it) => it && it.type === "function_call" && it.call_id === item.call_id);
    if (shown) return null;
  }
  const render = RENDERERS[item.type] || generic;
  try {
    return render(ctx, item, meta, index);
  } catch (err) {
    return h("div", { class: "nbr-tool nbr-generic" }, header("item", `${item.type} (could not render: ${err.message})`), genericJson(item));
  }
}
