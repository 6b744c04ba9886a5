"""The legacy Completions API (``/v1/completions``): request validation and response shapes.

``parse_completion`` turns the keywords of ``openai.AsyncOpenAI().completions.create`` (and
the JSON body a raw client such as lm-evaluation-harness's ``local-completions`` posts) into a
``CompletionRequest``; everything is supported or rejected with a 400 naming it, as for the
Responses API. The bounds and meanings of the shared fields (sampling, seeds, logprob counts,
stops, ``n``, ``logit_bias``, ``stream_options``) are the request core's
(``protocol/generation.py``); this module names the fields and builds the shapes. vLLM's
extensions that scoring tools rely on are accepted too: ``prompt_logprobs``, ``top_k``,
``ignore_eos``, ``stream_options.continuous_usage_stats``. ``score_method`` is ours: how prompt
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

from nbresponses.protocol.errors import bad_request, unsupported
from nbresponses.protocol.events import TokenLogprob
from nbresponses.protocol.generation import (
    Sampling,
    StreamOptions,
    check_model,
    check_names,
    choice_count,
    logprob_count,
    parse_sampling,
    request_body,
    stop_strings,
    stream_options,
    token_limit,
)
from nbresponses.protocol.ids import new_id
from nbresponses.protocol.values import boolean

SDK_PARAMETERS = frozenset(inspect.signature(AsyncCompletions.create).parameters) - {"self"}
# vLLM's extensions (its OpenAI server) that we honour, and ours.
EXTENSIONS = frozenset({"prompt_logprobs", "top_k", "ignore_eos", "score_method"})
KNOWN = SDK_PARAMETERS | EXTENSIONS
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for the legacy endpoint
ScoreMethod = Literal["prefill", "decode"]
FinishReason = Literal["stop", "length"]


@dataclass
class CompletionRequest:
    """A validated completions call: prompts are text or token ids, ``n`` choices each.

    Choice ``i * n + j`` is prompt ``i``'s ``j``-th (OpenAI's and vLLM's order); its seed is
    ``sampling.choice_seeds(n)[j]``."""

    prompts: list[str | list[int]]
    model: str
    max_tokens: int = DEFAULT_MAX_TOKENS
    n: int = 1
    echo: bool = False
    logprobs: int | None = None  # top-k alternatives per token; None: no logprobs
    prompt_logprobs: int | None = None  # vLLM: top-k per prompt position; None: none
    stream: bool = False
    stream_options: StreamOptions = field(default_factory=StreamOptions)
    stop: list[str] = field(default_factory=list)
    sampling: Sampling = field(default_factory=Sampling)
    ignore_eos: bool = False
    score_method: ScoreMethod = "prefill"

    @property
    def scores_prompt(self) -> bool:
        """The prompt's tokens need logprobs (echoed with logprobs, or vLLM's prompt_logprobs)."""
        return (self.echo and self.logprobs is not None) or self.prompt_logprobs is not None


def parse_completion(kwargs: Mapping[str, Any], *, model: str) -> CompletionRequest:
    """Validate ``completions.create`` keywords (SDK names plus vLLM's extensions): the
    Completions adapter over the request core (``protocol/generation.py``)."""
    params = request_body(kwargs)
    check_names(params, KNOWN)
    check_model(params, model)
    _only(params, "best_of", 1, "one candidate per choice; ask for n choices instead")
    _only(params, "frequency_penalty", 0, "the engine applies no penalties")
    _only(params, "presence_penalty", 0, "the engine applies no penalties")
    if params.get("suffix"):
        raise unsupported("suffix", "there is no insertion mode")
    if "user" in params and not isinstance(params["user"], str):
        raise bad_request("Invalid type for 'user': expected a string.", param="user")
    if "prompt" not in params:
        raise bad_request("Missing required parameter: 'prompt'.", param="prompt")
    req = CompletionRequest(prompts=_prompts(params["prompt"]), model=model)
    limit = token_limit(params, "max_tokens", low=0)
    req.max_tokens = DEFAULT_MAX_TOKENS if limit is None else limit
    req.n = choice_count(params)
    if params.get("best_of", req.n) < req.n:  # (best_of is 1 here: the check above)
        raise bad_request(
            f"best_of ({params['best_of']}) must be at least n ({req.n}).", param="best_of"
        )
    req.echo = boolean(params, "echo", False)
    req.logprobs = logprob_count(params, "logprobs")
    req.prompt_logprobs = logprob_count(params, "prompt_logprobs")
    req.stream = boolean(params, "stream", False)
    req.stream_options = stream_options(params, stream=req.stream)
    req.stop = stop_strings(params)
    req.sampling = parse_sampling(params)
    req.ignore_eos = boolean(params, "ignore_eos", False)
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
