"""The prepared model's tokenizer, loaded from its own files without importing transformers.

Why: ``AutoTokenizer.from_pretrained`` costs ~3 s in a fresh kernel, nearly all of it importing
transformers (which imports torch, ``torch._dynamo`` and more) before it reads a 3.5 MB
``tokenizer.json``. Loading a prepared model should cost what running it costs (an ONNX Runtime
session), so the engine's tokenizer is the ``tokenizers`` backend that transformers itself wraps
(``tokenizer.json``, as transformers saved it at prepare time) plus the chat template compiled
exactly as transformers compiles it (same jinja environment, filters and globals).

What the package asks of a tokenizer (``tokens.contract.Tokenizer``, the special tokens, the
chat template) is answered here with transformers' semantics; anything else (``tokenizer(text)``,
``tokenize``, ``batch_decode``, ``apply_chat_template(..., return_dict=True)``, ...) goes to the
real transformers tokenizer, built from the same folder on first use. ``tests/models/
test_tokenizer.py`` checks both give the same ids, texts and tokens.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

# transformers' SPECIAL_TOKENS_ATTRIBUTES, in its order (special_tokens_map follows it)
_SPECIAL = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
# apply_chat_template arguments this class renders itself; any other goes to transformers
_OWN_TEMPLATE_ARGS = {"tools", "add_generation_prompt", "tokenize"}


def _content(value: Any) -> str | None:
    """A special token as tokenizer_config.json stores it: a string or a serialized AddedToken."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


class StoredTokenizer:
    """A prepared folder's fast tokenizer: ``tokenizers`` + the chat template, no transformers.

    Use ``StoredTokenizer.load(folder)``, which returns None when the folder has no
    ``tokenizer.json`` (slow-only tokenizers: the caller uses transformers then).
    """

    def __init__(self, folder: Path, backend: Any, config: dict[str, Any]) -> None:
        self.name_or_path = str(folder)
        self._folder = folder
        self._backend = backend
        self._config = config
        self.chat_template: str | None = _chat_template(folder, config)
        self.clean_up_tokenization_spaces = bool(config.get("clean_up_tokenization_spaces", False))
        stored = _special_tokens(folder, config)
        self.bos_token: str | None = stored["bos_token"]
        self.eos_token: str | None = stored["eos_token"]
        self.unk_token: str | None = stored["unk_token"]
        self.sep_token: str | None = stored["sep_token"]
        self.pad_token: str | None = stored["pad_token"]
        self.cls_token: str | None = stored["cls_token"]
        self.mask_token: str | None = stored["mask_token"]
        self.additional_special_tokens: list[str] = list(
            stored.get("additional_special_tokens") or []
        )

    @classmethod
    def load(cls, folder: str | Path) -> StoredTokenizer | None:
        folder = Path(folder)
        if not (folder / "tokenizer.json").is_file():
            return None
        from tokenizers import Tokenizer

        config: dict[str, Any] = {}
        if (folder / "tokenizer_config.json").is_file():
            config = json.loads((folder / "tokenizer_config.json").read_text())
        return cls(folder, Tokenizer.from_file(str(folder / "tokenizer.json")), config)

    # -- the contract (tokens/contract.py) with transformers' semantics -------------------------

    @property
    def backend_tokenizer(self) -> Any:
        return self._backend

    def _id(self, token: str | None) -> int | None:
        return None if token is None else self._backend.token_to_id(token)

    @property
    def bos_token_id(self) -> int | None:
        return self._id(self.bos_token)

    @property
    def eos_token_id(self) -> int | None:
        return self._id(self.eos_token)

    @property
    def pad_token_id(self) -> int | None:
        return self._id(self.pad_token)

    @property
    def unk_token_id(self) -> int | None:
        return self._id(self.unk_token)

    @property
    def special_tokens_map(self) -> dict[str, Any]:
        found: dict[str, Any] = {a: getattr(self, a) for a in _SPECIAL if getattr(self, a)}
        if self.additional_special_tokens:
            found["additional_special_tokens"] = list(self.additional_special_tokens)
        return found

    @property
    def all_special_tokens(self) -> list[str]:
        seen: list[str] = []
        for value in self.special_tokens_map.values():
            for token in value if isinstance(value, list) else [value]:
                if token not in seen:
                    seen.append(token)
        return seen

    @property
    def all_special_ids(self) -> list[int]:
        return [i for i in map(self._id, self.all_special_tokens) if i is not None]

    @property
    def added_tokens_decoder(self) -> dict[int, Any]:
        return dict(sorted(self._backend.get_added_tokens_decoder().items()))

    @property
    def vocab_size(self) -> int:
        return int(self._backend.get_vocab_size(with_added_tokens=False))

    def __len__(self) -> int:
        return int(self._backend.get_vocab_size(with_added_tokens=True))

    @cached_property
    def _vocab(self) -> dict[str, int]:
        return dict(self._backend.get_vocab(with_added_tokens=True))

    def get_vocab(self) -> dict[str, int]:
        """A fresh dict, as transformers gives (a copy of one read: 2 ms instead of 23)."""
        return dict(self._vocab)

    def encode(self, text: str, *args: Any, add_special_tokens: bool = True, **kwargs: Any) -> Any:
        if args or kwargs or not isinstance(text, str):  # pairs, truncation, tensors, ...
            return self._transformers.encode(
                text, *args, add_special_tokens=add_special_tokens, **kwargs
            )
        return list(self._backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(
        self,
        token_ids: Any,
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool | None = None,
        **kwargs: Any,
    ) -> str:
        if kwargs:
            return str(
                self._transformers.decode(
                    token_ids,
                    skip_special_tokens=skip_special_tokens,
                    clean_up_tokenization_spaces=clean_up_tokenization_spaces,
                    **kwargs,
                )
            )
        ids = [int(token_ids)] if _is_int(token_ids) else [int(i) for i in token_ids]
        text = str(self._backend.decode(ids, skip_special_tokens=skip_special_tokens))
        if clean_up_tokenization_spaces is None:
            clean_up_tokenization_spaces = self.clean_up_tokenization_spaces
        return _clean_up_tokenization(text) if clean_up_tokenization_spaces else text

    def convert_ids_to_tokens(self, ids: Any, skip_special_tokens: bool = False) -> Any:
        if _is_int(ids):
            return self._backend.id_to_token(int(ids))
        skip = set(self.all_special_ids) if skip_special_tokens else set()
        return [self._backend.id_to_token(int(i)) for i in ids if int(i) not in skip]

    def convert_tokens_to_ids(self, tokens: Any) -> Any:
        if isinstance(tokens, str):
            found = self._backend.token_to_id(tokens)
            return self.unk_token_id if found is None else found
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def apply_chat_template(self, conversation: Any, *args: Any, **kwargs: Any) -> Any:
        """transformers' rendering for one conversation of message dicts and JSON-schema tools;
        any other use (batches, ``return_dict``, documents, ...) is transformers' own."""
        tools = kwargs.get("tools")
        own = (
            not args
            and isinstance(self.chat_template, str)
            and isinstance(conversation, list | tuple)
            and all(isinstance(m, Mapping) for m in conversation)
            and (tools is None or all(isinstance(t, Mapping) for t in tools))
            and not ({"documents", "chat_template", "continue_final_message"} & set(kwargs))
        )
        extra = {k: v for k, v in kwargs.items() if k not in _OWN_TEMPLATE_ARGS}
        if not own or any(k in extra for k in _TRANSFORMERS_ONLY):
            return self._transformers.apply_chat_template(conversation, *args, **kwargs)
        assert isinstance(self.chat_template, str)
        text = _compiled(self.chat_template).render(
            messages=list(conversation),
            tools=list(tools) if tools is not None else None,
            documents=None,
            add_generation_prompt=bool(kwargs.get("add_generation_prompt", False)),
            **{**self.special_tokens_map, **extra},
        )
        if not kwargs.get("tokenize", True):
            return text
        return self.encode(text, add_special_tokens=False)

    # -- everything else: the transformers tokenizer of the same folder ------------------------

    @cached_property
    def _transformers(self) -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.name_or_path)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._transformers(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_folder", "_backend", "_config", "_vocab"):
            raise AttributeError(name)
        return getattr(self._transformers, name)

    def __repr__(self) -> str:
        return f"StoredTokenizer({self.name_or_path!r}, vocab={len(self)})"


# keyword arguments of apply_chat_template that change what it returns: transformers answers them
_TRANSFORMERS_ONLY = (
    "padding",
    "truncation",
    "max_length",
    "return_tensors",
    "return_dict",
    "return_assistant_tokens_mask",
    "tokenizer_kwargs",
)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) or (hasattr(value, "ndim") and value.ndim == 0)


def _clean_up_tokenization(text: str) -> str:
    """transformers' ``clean_up_tokenization`` (spaces before punctuation and contractions)."""
    for old, new in (
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ):
        text = text.replace(old, new)
    return text


def _chat_template(folder: Path, config: dict[str, Any]) -> Any:
    """Where transformers 4.57 keeps it: chat_template.jinja, else tokenizer_config.json (a
    string, or named templates as a list of {name, template}: returned as a dict)."""
    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):
        return {t["name"]: t["template"] for t in template}
    return template


def _special_tokens(folder: Path, config: dict[str, Any]) -> dict[str, Any]:
    """The special tokens as transformers reads them: tokenizer_config.json, overridden by
    special_tokens_map.json."""
    found: dict[str, Any] = {a: _content(config.get(a)) for a in _SPECIAL}
    extra = config.get("additional_special_tokens") or []
    path = folder / "special_tokens_map.json"
    if path.is_file():
        mapped = json.loads(path.read_text())
        for attr in _SPECIAL:
            if attr in mapped:
                found[attr] = _content(mapped[attr])
        extra = mapped.get("additional_special_tokens", extra)
    found["additional_special_tokens"] = [c for c in map(_content, extra) if c is not None]
    return found


_TEMPLATES: dict[str, Any] = {}


def _compiled(template: str) -> Any:
    """The template compiled as ``transformers.utils.chat_template_utils`` compiles it."""
    hit = _TEMPLATES.get(template)
    if hit is None:
        hit = _TEMPLATES[template] = _environment().from_string(template)
    return hit


def _environment() -> Any:
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """``{% generation %}`` blocks (assistant masks, which transformers computes): their
        body renders as is."""

        tags = {"generation"}  # noqa: RUF012 (jinja's own class attribute)

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_body")
            return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _body(self, caller: Callable[[], str]) -> str:
            return caller()

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: Iterable[str] | None = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x,
            ensure_ascii=ensure_ascii,
            indent=indent,
            separators=tuple(separators) if separators is not None else None,  # type: ignore[arg-type]
            sort_keys=sort_keys,
        )

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env
