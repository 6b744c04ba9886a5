"""The legacy Completions API (``/v1/completions``): request validation and response shapes.

``parse_completion`` turns the keywords of ``openai.AsyncOpenAI().completions.create`` (and
the JSON body a raw client such as lm-evaluation-harness's ``local-completions`` posts) into a
``CompletionRequest``; everything is supported or rejected with a 400 naming it, as for the
Responses API. vLLM's extensions that scoring tools rely on are accepted too:
``prompt_logprobs``, ``top_k``, ``ignore_eos``. ``score_method`` is ours: how prompt
logprobs are computed (``"prefill"``, the default, or ``"decode"``; see
docs/concepts/scoring.md).

The builders make ``openai.types.Completion`` objects: OpenAI's ``logprobs`` shape (``tokens``,
``token_logprobs``, ``top_logprobs``, ``text_offset``; the first prompt token has no logprob,
``null``) and vLLM's ``prompt_logprobs`` (per prompt position ``null`` or ``{token id:
{"logprob", "rank", "decoded_token"}}``), an extra field of the choice that the type keeps.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from openai.resources.completions import AsyncCompletions
from openai.types import Completion, CompletionChoice, CompletionUsage
from openai.types.completion_choice import Logprobs
from openai.types.completion_usage import PromptTokensDetails

from nbresponses.protocol.errors import bad_request, not_found, unsupported
from nbresponses.protocol.events import TokenLogprob
from nbresponses.protocol.ids import new_id
from nbresponses.protocol.request import TRANSPORT, check_values, given
from nbresponses.protocol.values import integer, number

SDK_PARAMETERS = frozenset(inspect.signature(AsyncCompletions.create).parameters) - {"self"}
# vLLM's extensions (its OpenAI server) that we honour, and ours.
EXTENSIONS = frozenset({"prompt_logprobs", "top_k", "ignore_eos", "score_method"})
MAX_LOGPROBS = 20  # as the engine's top_logprobs (vLLM's default max_logprobs is 20 too)
MAX_STOPS = 4  # OpenAI's limit on stop sequences
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for the legacy endpoint
ScoreMethod = Literal["prefill", "decode"]
FinishReason = Literal["stop", "length"]


@dataclass
class CompletionRequest:
    """A validated completions call: prompts are text or token ids, one choice each."""

    prompts: list[str | list[int]]
    model: str
    max_tokens: int = DEFAULT_MAX_TOKENS
    echo: bool = False
    logprobs: int | None = None  # top-k alternatives per token; None: no logprobs
    prompt_logprobs: int | None = None  # vLLM: top-k per prompt position; None: none
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    ignore_eos: bool = False
    score_method: ScoreMethod = "prefill"

    @property
    def scores_prompt(self) -> bool:
        """The prompt's tokens need logprobs (echoed with logprobs, or vLLM's prompt_logprobs)."""
        return (self.echo and self.logprobs is not None) or self.prompt_logprobs is not None


def parse_completion(kwargs: Mapping[str, Any], *, model: str) -> CompletionRequest:
    """Validate ``completions.create`` keywords (SDK names plus vLLM's extensions)."""
    params = {k: v for k, v in kwargs.items() if k not in TRANSPORT and k != "extra_body"}
    extra = kwargs.get("extra_body")
    if given(extra):
        if not isinstance(extra, Mapping):
            raise bad_request("'extra_body' must be a mapping.", param="extra_body")
        params.update(extra)
    params = {k: v for k, v in params.items() if given(v)}
    check_values(params)
    for key in params:
        if key not in SDK_PARAMETERS and key not in EXTENSIONS:
            raise bad_request(f"Unknown parameter: '{key}'.", param=key, code="unknown_parameter")
    if "model" in params and params["model"] != model:
        raise not_found(
            f"The model '{params['model']}' does not exist here; this server runs '{model}'.",
            param="model",
            code="model_not_found",
        )
    _only(params, "n", 1, "one choice per prompt (send the prompt again for more)")
    _only(params, "best_of", 1, "one choice per prompt")
    _only(params, "frequency_penalty", 0, "the engine applies no penalties")
    _only(params, "presence_penalty", 0, "the engine applies no penalties")
    if params.get("logit_bias"):
        raise unsupported("logit_bias")
    if params.get("suffix"):
        raise unsupported("suffix", "there is no insertion mode")
    if "user" in params and not isinstance(params["user"], str):
        raise bad_request("Invalid type for 'user': expected a string.", param="user")
    if "prompt" not in params:
        raise bad_request("Missing required parameter: 'prompt'.", param="prompt")
    req = CompletionRequest(prompts=_prompts(params["prompt"]), model=model)
    req.max_tokens = integer(params, "max_tokens", 0, None, DEFAULT_MAX_TOKENS)
    req.echo = _bool(params, "echo")
    req.logprobs = integer(params, "logprobs", 0, MAX_LOGPROBS)
    req.prompt_logprobs = integer(params, "prompt_logprobs", 0, MAX_LOGPROBS)
    req.stream = _bool(params, "stream")
    req.include_usage = _stream_options(params.get("stream_options"), req.stream)
    req.stop = _stop(params.get("stop"))
    req.seed = integer(params, "seed", -(2**63), 2**64 - 1)
    req.temperature = number(params, "temperature", 0.0, 2.0, 1.0)
    req.top_p = number(params, "top_p", 0.0, 1.0, 1.0)
    req.top_k = integer(params, "top_k", -1, None, 0)
    req.ignore_eos = _bool(params, "ignore_eos")
    method = params.get("score_method", "prefill")
    if method not in ("prefill", "decode"):
        raise bad_request(
            f"Invalid 'score_method': {method!r} (use 'prefill' or 'decode').",
            param="score_method",
        )
    req.score_method = method
    if req.max_tokens == 0 and not req.echo:
        raise bad_request(
            "max_tokens=0 generates nothing: with echo=True it scores the prompt only.",
            param="max_tokens",
        )
    return req


def _only(params: Mapping[str, Any], key: str, value: Any, why: str) -> None:
    if key in params and params[key] != value:
        raise unsupported(key, f"only {value} ({why}).")


def _prompts(value: Any) -> list[str | list[int]]:
    """OpenAI's four prompt forms: a string, strings, token ids, lists of token ids."""
    if isinstance(value, str):
        prompts: list[Any] = [value]
    elif isinstance(value, list | tuple) and value and all(_is_id(v) for v in value):
        prompts = [list(value)]
    elif isinstance(value, list | tuple) and value:
        prompts = list(value)
    else:
        raise bad_request(
            "'prompt' must be a string, a list of strings, a list of token ids or a list of "
            "lists of token ids, and not empty.",
            param="prompt",
        )
    out: list[str | list[int]] = []
    for i, prompt in enumerate(prompts):
        where = f"prompt[{i}]" if len(prompts) > 1 or not isinstance(value, str) else "prompt"
        if isinstance(prompt, str):
            if not prompt:
                raise bad_request(f"Invalid '{where}': the prompt is empty.", param=where)
            out.append(prompt)
        elif isinstance(prompt, list | tuple) and prompt and all(_is_id(v) for v in prompt):
            out.append([int(v) for v in prompt])
        else:
            raise bad_request(
                f"Invalid '{where}': expected a non-empty string or list of token ids "
                "(integers >= 0).",
                param=where,
            )
    return out


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _bool(params: Mapping[str, Any], key: str) -> bool:
    value = params.get(key, False)
    if not isinstance(value, bool):
        raise bad_request(f"Invalid type for '{key}': expected a boolean.", param=key)
    return value


def _stop(value: Any) -> list[str]:
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list | tuple) or len(stops) > MAX_STOPS:
        raise bad_request(
            f"'stop' must be a string or a list of at most {MAX_STOPS} strings.", param="stop"
        )
    for i, stop in enumerate(stops):
        if not isinstance(stop, str) or not stop:
            raise bad_request(f"Invalid 'stop[{i}]': expected a non-empty string.", param="stop")
    return list(stops)


def _stream_options(value: Any, stream: bool) -> bool:
    if value is None:
        return False
    if not stream:
        raise bad_request("'stream_options' needs stream=True.", param="stream_options")
    if not isinstance(value, Mapping):
        raise bad_request(
            "'stream_options' must be an object such as {'include_usage': true}.",
            param="stream_options",
        )
    for key, v in value.items():
        if key != "include_usage":
            raise unsupported(f"stream_options.{key}")
        if not isinstance(v, bool):
            raise bad_request(
                "'stream_options.include_usage' must be a boolean.",
                param="stream_options.include_usage",
            )
    return bool(value.get("include_usage", False))


# -- response shapes ------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenEntry:
    """One token of a choice's text: what ``logprobs`` reports for it.

    ``logprob`` is None for the first prompt token (nothing predicts it); ``offset`` is where
    the token's text starts in the choice's text.
    """

    id: int
    token: str  # its display string (OpenAI's ``bytes:\\x..`` for part of a character)
    offset: int
    logprob: TokenLogprob | None = None
    top_ids: tuple[int, ...] = ()  # the ids of ``logprob.top``, best first
    rank: int | None = None
    entropy: float | None = None


def logprobs(entries: Sequence[TokenEntry], top: int) -> Logprobs:
    """OpenAI's shape: per token its string, logprob, top ``top`` alternatives plus itself
    (OpenAI: "up to logprobs+1 elements"), and text offset."""
    tops: list[dict[str, float] | None] = []
    for entry in entries:
        lp = entry.logprob
        if lp is None:
            tops.append(None)
            continue
        alternatives = {token: value for token, _, value in lp.top[:top]}
        alternatives.setdefault(lp.token, lp.logprob)
        tops.append(alternatives)
    return Logprobs.model_construct(  # None entries: the type says float, OpenAI sends null
        tokens=[e.token for e in entries],
        token_logprobs=[e.logprob.logprob if e.logprob else None for e in entries],
        top_logprobs=tops,
        text_offset=[e.offset for e in entries],
    )


PromptLogprobs = list[dict[str, dict[str, Any]] | None]


def prompt_logprobs(entries: Sequence[TokenEntry], top: int) -> PromptLogprobs:
    """vLLM's shape: per prompt position None (the first) or {token id: {"logprob", "rank",
    "decoded_token"}}, the prompt's own token and the ``top`` most likely ones. The prompt
    token's entry also carries the ``entropy`` of its distribution (our extension)."""
    out: PromptLogprobs = []
    for entry in entries:
        lp = entry.logprob
        if lp is None:
            out.append(None)
            continue
        own = {"logprob": lp.logprob, "rank": entry.rank, "decoded_token": lp.token}
        if entry.entropy is not None:
            own["entropy"] = entry.entropy
        position: dict[str, dict[str, Any]] = {str(entry.id): own}
        pairs = zip(entry.top_ids, lp.top, strict=False)
        for rank, (token_id, (token, _, value)) in enumerate(pairs, 1):
            if rank > top:
                break
            alternative = {"logprob": value, "rank": rank, "decoded_token": token}
            position.setdefault(str(token_id), alternative)
        out.append(position)
    return out


def choice(
    index: int,
    text: str,
    *,
    finish_reason: FinishReason | None,
    logprobs: Logprobs | None = None,
    prompt_logprobs: PromptLogprobs | None = None,
) -> CompletionChoice:
    """One choice; ``finish_reason`` is None on a stream's chunks before the last."""
    fields: dict[str, Any] = {
        "index": index,
        "text": text,
        "finish_reason": finish_reason,
        "logprobs": logprobs,
    }
    if prompt_logprobs is not None:
        fields["prompt_logprobs"] = prompt_logprobs
    return CompletionChoice.model_construct(**fields)


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> CompletionUsage:
    return CompletionUsage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
    )


def completion(
    completion_id: str,
    created: int,
    model: str,
    choices: list[CompletionChoice],
    usage: CompletionUsage | None = None,
) -> Completion:
    return Completion.model_construct(
        id=completion_id,
        object="text_completion",
        created=created,
        model=model,
        choices=choices,
        usage=usage,
        system_fingerprint=None,
    )


def new_completion_id() -> tuple[str, int]:
    """OpenAI's ``cmpl-`` ids, and the creation time in seconds."""
    return "cmpl-" + new_id("cmpl").partition("_")[2], int(time.time())
