// Live rendering whose cost per frame is bounded by what arrived, not by the text so far.
//
// A streamed answer only grows, so what is already on the page stays: Markdown is cut into
// blocks and a frame renders only the last one (plus any that the new text closed); the
// heat map appends the new tokens' spans. The cuts are a function of the text alone, so a
// view that mounts on the finished text draws exactly what the live one drew.
import { renderMarkdown } from "./markdown.js";
import { tokenSpan } from "./heatmap.js";

// A block ends at a blank line (outside fenced code) followed by a line that starts at the
// margin; one longer than this is cut at a line break, a single longer line at a space.
export const MAX_BLOCK = 4096;
const FENCE = /^ {0,3}(`{3,}|~{3,})/;

export class MarkdownStream {
  constructor(className = "nbr-md") {
    this.el = document.createElement("div");
    this.el.className = className;
    this.reset();
  }

  reset() {
    this.text = "";
    this.start = 0; // where the open (last) block starts
    this.pos = 0; // scanned up to here
    this.midline = false; // `pos` is inside a line (a long line was cut there)
    this.fence = null; // the opening line of the fenced code block open at `pos`
    this.blank = false; // the line before `pos` was blank, outside fenced code
    this.prefix = ""; // the open block continues a code block: its opening line
    this.cont = false; // the open block continues one cut for length
    this.open = null; // the open block's element
    this.el.replaceChildren();
  }

  update(value) {
    const text = String(value ?? "");
    if (text === this.text && (this.open || !text)) return this.el;
    if (text.length < this.text.length || !text.startsWith(this.text)) this.reset();
    this.text = text;
    this.scan();
    this.draw(text.length, false);
    return this.el;
  }

  scan() {
    const text = this.text;
    while (this.pos < text.length) {
      const limit = this.start + MAX_BLOCK;
      const nl = text.indexOf("\n", this.pos);
      const end = nl < 0 ? -1 : nl + 1;
      if (end < 0 || end > limit) {
        // this line does not fit in the block, or has not ended yet
        if (text.length < limit && end < 0) return; // undecided until more text arrives
        if (this.pos > this.start) this.cut(this.pos, true, false);
        else this.cut(lineCut(text, this.start, limit), true, true);
        continue;
      }
      const line = text.slice(this.pos, nl);
      if (this.midline) {
        this.midline = false; // the rest of a cut line: neither a fence nor a blank line
      } else {
        if (!this.fence && this.blank && this.pos > this.start && /^\S/.test(line)) this.cut(this.pos, false, false);
        const m = FENCE.exec(line);
        if (this.fence) {
          const opener = FENCE.exec(this.fence)[1];
          if (m && m[1][0] === opener[0] && m[1].length >= opener.length && line.trim() === m[1]) this.fence = null;
        } else if (m) {
          this.fence = line;
        }
        this.blank = !this.fence && line.trim() === "";
      }
      this.pos = end;
    }
  }

  // End the open block at `at` (it is final from now on) and open the next one there.
  cut(at, long, midline) {
    this.draw(at, true, long);
    this.start = at;
    this.pos = at;
    this.midline = midline;
    this.prefix = this.fence ? `${this.fence}\n` : "";
    this.cont = long;
    this.blank = false;
  }

  // Render the open block up to `end`; `final`: it will not change again; `cut`: the next
  // block continues it (it was cut for length).
  draw(end, final, cut = false) {
    if (end <= this.start) {
      if (this.open) this.open.remove();
      this.open = null;
      return;
    }
    const block = document.createElement("div");
    block.className = `nbr-md-block${this.cont ? " nbr-md-cont" : ""}${cut ? " nbr-md-cut" : ""}`;
    block.append(renderMarkdown(this.prefix + this.text.slice(this.start, end)));
    if (this.open) this.open.replaceWith(block);
    else this.el.append(block);
    this.open = final ? null : block;
  }
}

function lineCut(text, start, limit) {
  const space = text.lastIndexOf(" ", limit - 1);
  let at = space > start + MAX_BLOCK / 2 ? space + 1 : limit;
  const code = text.charCodeAt(at - 1);
  if (code >= 0xd800 && code <= 0xdbff) at -= 1; // never between the halves of a pair
  return at;
}

// The heat map of one text part: spans are added for new tokens only, into lines (a block
// each: appending to one block of 100,000 spans lays them all out again) that end after a
// token ending in a line break, or after LINE_TOKENS tokens.
export const LINE_TOKENS = 512;

export class TokenStream {
  constructor() {
    this.el = document.createElement("div");
    this.el.className = "nbr-tokens";
    this.reset();
  }

  reset() {
    this.el.replaceChildren();
    this.list = null;
    this.count = 0;
    this.last = undefined;
    this.line = null;
    this.inLine = 0;
  }

  update(logprobs, background) {
    const key = background.join(",");
    // the same list, or a copy of it that may have grown (a final item replaces the part)
    const prev = this.count > 0 ? logprobs[this.count - 1] : undefined;
    const same = this.list === logprobs || (prev && this.last && prev.token === this.last.token && prev.logprob === this.last.logprob);
    if (!same || logprobs.length < this.count || key !== this.background) this.reset();
    this.list = logprobs;
    this.background = key;
    let spans = [];
    const flush = () => {
      if (spans.length) this.line.append(...spans);
      spans = [];
    };
    for (let i = this.count; i < logprobs.length; i++) {
      if (!this.line || this.inLine >= LINE_TOKENS) {
        flush();
        this.line = document.createElement("div");
        this.line.className = "nbr-token-line";
        this.el.append(this.line);
        this.inLine = 0;
      }
      const span = tokenSpan(logprobs[i], i, background);
      spans.push(span);
      this.inLine += 1;
      if (span.textContent.endsWith("\n")) this.inLine = LINE_TOKENS;
    }
    flush();
    this.count = logprobs.length;
    this.last = logprobs[this.count - 1];
    return this.el;
  }
}

// Plain text that grows: the new characters are appended to the one text node.
export class PlainStream {
  constructor() {
    this.el = document.createElement("div");
    this.el.className = "nbr-plain";
    this.node = document.createTextNode("");
    this.el.append(this.node);
  }

  update(value) {
    const text = String(value ?? "");
    const old = this.node.data;
    if (text.length >= old.length && text.startsWith(old)) this.node.appendData(text.slice(old.length));
    else this.node.data = text;
    return this.el;
  }
}

// A per-view cache of streams, one per rendered part.
export function streamFor(ui, key, make) {
  let stream = ui.streams.get(key);
  if (!stream) {
    stream = make();
    ui.streams.set(key, stream);
  }
  return stream;
}
