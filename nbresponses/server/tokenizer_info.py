"""``GET /tokenizer_info`` in vLLM's shape: the tokenizer's configuration as JSON.

vLLM answers with the tokenizer's ``init_kwargs`` (what ``tokenizer_config.json`` holds), each
special token as its text, plus ``tokenizer_class`` and the chat template. lm-evaluation-harness
reads it for ``tokenizer_backend=remote`` (and ``auto``, its default for ``local-completions``):
``eos_token``, ``bos_token`` and ``chat_template``, the rest through ``/tokenize``. Answering it
lets lm-eval run against ``nbresponses serve`` offline, with no tokenizer on the client's side.
"""

from __future__ import annotations

from typing import Any

# Paths on the server's disk: meaningless to a client, and not ours to publish.
PATH_KEYS = ("vocab_file", "merges_file", "tokenizer_file", "name_or_path")


def _plain(value: Any) -> Any:
    """JSON-ready: an ``AddedToken`` (anything with ``content``) is its text."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    content = getattr(value, "content", None)
    return content if isinstance(content, str) else str(value)


def tokenizer_info(tokenizer: Any, model: str) -> dict[str, Any]:
    """The configuration of ``tokenizer`` (a transformers tokenizer), as vLLM serves it;
    ``name_or_path`` is the served model's name rather than a folder on this machine."""
    config = {
        key: _plain(value)
        for key, value in dict(getattr(tokenizer, "init_kwargs", None) or {}).items()
        if key not in PATH_KEYS
    }
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):  # as the tokenizer uses them
        token = getattr(tokenizer, name, None)
        if token is not None:
            config[name] = _plain(token)
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str) and template:
        config["chat_template"] = template
    config["name_or_path"] = model
    config["tokenizer_class"] = type(tokenizer).__name__
    return config
