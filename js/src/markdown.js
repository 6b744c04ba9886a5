// Markdown to sanitised DOM. Model output is untrusted: raw HTML in it is shown as text,
// the result is sanitised again by DOMPurify (no script, no event handlers, no javascript:
// URLs, no remote loads: images, media, frames and style are removed), and links open in a
// new tab without an opener or referrer.
import { Marked } from "marked";
import createDOMPurify from "dompurify";

export function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

const marked = new Marked({ gfm: true, async: false });
marked.use({
  renderer: {
    html({ text }) {
      return escapeHtml(text);
    },
    image({ href, text }) {
      // never fetch: show the image as a plain, inert label with its address
      return `<span class="nbr-image">[image: ${escapeHtml(text || "")} ${escapeHtml(href || "")}]</span>`;
    },
  },
});

const FORBID_TAGS = [
  "img", "image", "picture", "source", "video", "audio", "track", "iframe", "frame", "object", "embed",
  "style", "link", "meta", "base", "form", "input", "button", "textarea", "select", "svg", "math",
];
const FORBID_ATTR = ["style", "srcset", "background", "poster", "action", "formaction", "xlink:href", "ping"];
const SAFE_HREF = /^(https?:|mailto:|#)/i;

let purifier = null;
function purify() {
  if (purifier) return purifier;
  purifier = createDOMPurify(window);
  purifier.addHook("afterSanitizeAttributes", (node) => {
    if (node.tagName === "A") {
      const href = node.getAttribute("href");
      if (href !== null && !SAFE_HREF.test(href.trim())) node.removeAttribute("href");
      node.setAttribute("target", "_blank");
      node.setAttribute("rel", "noopener noreferrer");
    }
  });
  return purifier;
}

export function renderMarkdown(text) {
  let html;
  try {
    html = marked.parse(String(text ?? ""));
  } catch {
    html = `<pre>${escapeHtml(text)}</pre>`;
  }
  return purify().sanitize(html, {
    USE_PROFILES: { html: true },
    FORBID_TAGS,
    FORBID_ATTR,
    ALLOW_DATA_ATTR: false,
    RETURN_DOM_FRAGMENT: true,
  });
}
