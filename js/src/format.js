// Status and usage wording; mirrors nbresponses/view/summary.py so the live view and the
// static HTML fallback say the same thing.

export function statusOf(state) {
  const { response, view } = state;
  if (view.cancelled) return { key: "cancelled", label: "cancelled" };
  if (view.exception) return { key: "failed", label: "error" };
  if (view.phase === "done" && view.interrupted) return { key: "interrupted", label: "interrupted" };
  const status = response.status;
  if (status === "incomplete") {
    const reason = response.incomplete_details && response.incomplete_details.reason;
    return { key: "incomplete", label: reason ? `incomplete (${reason})` : "incomplete" };
  }
  if (status === "failed") {
    const message = response.error && response.error.message;
    return { key: "failed", label: message ? `failed: ${message}` : "failed" };
  }
  if (status) return { key: String(status), label: String(status).replace(/_/g, " ") };
  return view.phase === "done" ? { key: "completed", label: "done" } : { key: "queued", label: "waiting" };
}

const int = (v) => (Number.isInteger(v) ? v : 0);
export const fmtInt = (v) => int(v).toLocaleString("en-US");
export const fmtSeconds = (s) => (s < 10 ? `${s.toFixed(2)} s` : s < 60 ? `${s.toFixed(1)} s` : `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`);

export function tokensPerSecond(state) {
  const usage = state.response.usage || {};
  const generation = (state.view.timing || {}).generation;
  const tokens = int(usage.output_tokens) || (state.view.items || []).reduce((n, m) => n + int(m && m.deltas), 0);
  if (!generation || generation <= 0 || !tokens) return null;
  return tokens / generation;
}

// [label, value] pairs for the footer.
export function usageFacts(state) {
  const usage = state.response.usage;
  const timing = state.view.timing || {};
  const facts = [];
  if (usage) {
    const cached = int((usage.input_tokens_details || {}).cached_tokens);
    const reasoning = int((usage.output_tokens_details || {}).reasoning_tokens);
    facts.push(["input", fmtInt(usage.input_tokens)]);
    facts.push(["cached", fmtInt(cached)]);
    facts.push(["output", fmtInt(usage.output_tokens)]);
    facts.push(["reasoning", fmtInt(reasoning)]);
  }
  if (timing.ttft != null) facts.push(["first token", fmtSeconds(timing.ttft)]);
  const rate = tokensPerSecond(state);
  if (rate != null) facts.push(["speed", `${rate.toFixed(1)} tok/s`]);
  if (timing.wall != null) facts.push(["wall", fmtSeconds(timing.wall)]);
  else if (state.view.phase !== "done" && timing.elapsed) facts.push(["elapsed", fmtSeconds(timing.elapsed)]);
  return facts;
}
