"""A kernel-free HTML rendering of a view's state.

Saved notebooks, nbviewer, GitHub and exported HTML cannot run the widget, so the display
also carries this HTML. It is built here, in Python, with every model-produced string passed
through ``html.escape``: Markdown is shown as preformatted text, never as model HTML, and the
only links are http(s) citations, opened in a new tab without an opener or referrer.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any

from .summary import status_label, usage_line

_CSS = (
    "font-family:var(--jp-ui-font-family,var(--vscode-font-family,system-ui,sans-serif));"
    "font-size:13px;color:var(--jp-ui-font-color1,var(--vscode-foreground,inherit));"
    "border:1px solid var(--jp-border-color2,var(--vscode-panel-border,#ccc));"
    "border-radius:6px;padding:8px 10px;"
)
_PRE = (
    "white-space:pre-wrap;word-break:break-word;margin:4px 0;"
    "font-family:var(--jp-code-font-family,var(--vscode-editor-font-family,monospace));"
)
_MUTED = "color:var(--jp-ui-font-color2,var(--vscode-descriptionForeground,#666));"
_MAX_JSON = 4_000


def _pre(text: str) -> str:
    return f'<pre style="{_PRE}">{escape(text)}</pre>'


def _json(value: Any) -> str:
    text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    return text if len(text) <= _MAX_JSON else text[:_MAX_JSON] + "\n…"


def _pretty_arguments(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    except (ValueError, TypeError):
        return arguments


def _link(url: Any, label: Any) -> str:
    if not isinstance(url, str) or not url.lower().startswith(("https://", "http://")):
        return escape(str(label or url or ""))
    return (
        f'<a href="{escape(url, quote=True)}" target="_blank" rel="noopener noreferrer">'
        f"{escape(str(label or url))}</a>"
    )


def _annotations(annotations: list[Any]) -> str:
    links = []
    for note in annotations:
        if not isinstance(note, dict):
            continue
        if note.get("type") == "url_citation":
            links.append(_link(note.get("url"), note.get("title") or note.get("url")))
        elif note.get("filename") or note.get("file_id"):
            links.append(escape(str(note.get("filename") or note.get("file_id"))))
    if not links:
        return ""
    return f'<div style="{_MUTED}">Sources: ' + " · ".join(links) + "</div>"


def _message(item: dict[str, Any]) -> str:
    out = []
    for part in item.get("content") or []:
        if not isinstance(part, dict):
            continue
        if part.get("type") == "refusal":
            out.append(f"<div><b>Refusal:</b> {escape(str(part.get('refusal') or ''))}</div>")
            continue
        out.append(_pre(str(part.get("text") or "")))
        out.append(_annotations(part.get("annotations") or []))
    return "".join(out)


def _reasoning(item: dict[str, Any]) -> str:
    texts = [p.get("text") or "" for p in item.get("summary") or [] if isinstance(p, dict)]
    texts += [p.get("text") or "" for p in item.get("content") or [] if isinstance(p, dict)]
    body = "".join(_pre(t) for t in texts if t)
    if not body and item.get("encrypted_content"):
        body = f'<div style="{_MUTED}">encrypted reasoning</div>'
    return f"<details><summary>Reasoning</summary>{body}</details>"


def _item(item: Any) -> str:
    if not isinstance(item, dict):
        return ""
    kind = str(item.get("type") or "unknown")
    status = (
        f' <span style="{_MUTED}">{escape(str(item["status"]))}</span>'
        if item.get("status")
        else ""
    )
    if kind == "message":
        return f"<div>{_message(item)}</div>"
    if kind == "reasoning":
        return _reasoning(item)
    if kind == "function_call":
        head = f"<div><b>ƒ {escape(str(item.get('name') or ''))}</b>{status}</div>"
        return head + _pre(_pretty_arguments(str(item.get("arguments") or "")))
    if kind == "code_interpreter_call":
        outputs = "".join(
            _pre(str(o.get("logs") or "")) if o.get("type") == "logs" else _pre(_json(o))
            for o in item.get("outputs") or []
            if isinstance(o, dict)
        )
        return (
            f"<div><b>code interpreter</b>{status}</div>"
            + _pre(str(item.get("code") or ""))
            + (outputs)
        )
    if kind == "web_search_call":
        action = item.get("action") or {}
        what = action.get("query") or action.get("url") or action.get("pattern") or ""
        return f"<div><b>web search</b> {escape(str(what))}{status}</div>"
    rest = {k: v for k, v in item.items() if k not in ("type", "id", "status")}
    return f"<div><b>{escape(kind)}</b>{status}</div>" + _pre(_json(rest))


def render_html(state: dict[str, Any]) -> str:
    """The whole view as self-contained, escaped HTML."""
    response, view = state["response"], state["view"]
    head = [f"<b>{escape(status_label(state))}</b>"]
    if response.get("model"):
        head.append(f'<span style="{_MUTED}">{escape(str(response["model"]))}</span>')
    parts = [f'<div class="nbr-static" style="{_CSS}">', "<div>" + " · ".join(head) + "</div>"]
    parts += [_item(item) for item in response.get("output") or []]
    for error in ([response.get("error")] if response.get("error") else []) + view["errors"]:
        if isinstance(error, dict):
            text = f"{error.get('code') or 'error'}: {error.get('message') or ''}"
            parts.append(f'<div style="color:var(--jp-error-color1,#c62828)">{escape(text)}</div>')
    if view.get("exception"):
        exc = view["exception"]
        parts.append(
            f"<div>{escape(str(exc.get('type')))}: {escape(str(exc.get('message')))}</div>"
        )
    if view.get("unknown_count"):
        parts.append(f'<div style="{_MUTED}">{view["unknown_count"]} unrecognised event(s)</div>')
    footer = usage_line(state)
    if footer:
        parts.append(f'<div style="{_MUTED}">{escape(footer)}</div>')
    parts.append("</div>")
    return "".join(parts)
