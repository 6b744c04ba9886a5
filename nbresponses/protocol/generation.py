"""The request core: the rules every API (Responses, Completions, Chat Completions) shares.

Each API is a thin adapter over this module: it names its fields (``max_output_tokens``,
``max_tokens``, ``max_completion_tokens``...), sets its defaults and builds its response
shape; every bound and every meaning is defined here, once, with one error shape (an
``openai.BadRequestError`` naming the parameter, ``protocol/errors.py``). A client's mistake
is a 400 on every API: nothing that passes these checks can fail in the engine's sampler.

The flow of an adapter::

    params = request_body(kwargs)            # extra_body merged, transport knobs dropped
    check_names(params, KNOWN, refused=...)  # unknown -> 400 unknown_parameter
    check_model(params, model)               # another model -> 404 model_not_found
    sampling = parse_sampling(params)        # temperature, top_p, top_k, seed, logit_bias
    top = logprob_count(params, "top_logprobs")
    stops = stop_strings(params)
    n = choice_count(params)
    options = stream_options(params, stream=..., accepted=...)
    ...
    engine = sampling.engine_params(max_tokens=..., logprobs=..., top_logprobs=top, ...)

The rules (and why):

- ``temperature``: a number in [0, 2] (OpenAI's range); 0 is greedy.
- ``top_p``: a number in [0, 1] (OpenAI's range). ``top_p=0`` keeps the smallest set of tokens
  whose probability reaches 0, which is the single most likely token: it is greedy decoding,
  the same as ``temperature=0``, on every API (OpenAI accepts 0; vLLM refuses it with a 400 and
  so never samples with it either; our sampler's nucleus needs ``top_p > 0``, so the core turns
  it into greedy before the engine sees it). The Response echoes the value as given.
- ``top_k`` (vLLM's extension): an integer >= -1; -1 and 0 mean no cut.
- ``seed``: any int64, [-2**63, 2**63 - 1] (vLLM's range; the sampler reads a negative seed as
  its two's complement). With ``n > 1`` choice ``i`` uses ``derived_seeds(seed, n)[i]``
  (``Sampling.choice_seeds``).
- logprob counts (``top_logprobs``, Completions' ``logprobs``, ``prompt_logprobs``): integers in
  [0, ``MAX_LOGPROBS``] = [0, 20], the engine's own limit.
- ``stop``: a string or a list of non-empty strings, any number of them (vLLM's behaviour;
  lm-eval sends five).
- token limits: integers >= the adapter's floor (1, or 0 where echo-only scoring exists).
- ``logit_bias``: a mapping of token ids (ints or digit strings) to numbers in [-100, 100],
  added to the logits before sampling; the ids are checked against the vocabulary by
  ``check_token_ids`` once the model is known (a 400 naming ``logit_bias``).
- ``n``: an integer in [1, ``MAX_CHOICES``].
- ``stream_options``: an object of booleans, only with ``stream=True``: ``include_usage``,
  vLLM's ``continuous_usage_stats`` (with ``include_usage``: every chunk carries the usage so
  far), ``include_obfuscation`` (we never pad, so there is nothing to turn off); each adapter
  says which it accepts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any

import openai

from nbresponses.protocol.errors import bad_request, not_found, unsupported
from nbresponses.protocol.values import integer, number
from nbresponses.runtime.sampling import MAX_TOP_LOGPROBS, derived_seeds
from nbresponses.tokens.contract import ConstraintFactory, SamplingParams

# The SDK's transport knobs: they shape an HTTP request, and there is none in process.
TRANSPORT = ("extra_headers", "extra_query", "timeout")
MAX_DEPTH = 100  # levels of nesting in any parameter (a JSON schema needs far fewer)
MAX_LOGPROBS = MAX_TOP_LOGPROBS  # 20: OpenAI's and vLLM's default limit, and the engine's
SEED_RANGE = (-(2**63), 2**63 - 1)  # int64, vLLM's bounds for ``seed``
TEMPERATURE_RANGE = (0.0, 2.0)
TOP_P_RANGE = (0.0, 1.0)
LOGIT_BIAS_RANGE = (-100.0, 100.0)  # OpenAI's
MAX_CHOICES = 128  # ``n``: OpenAI's bound on Chat Completions
LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")  # vLLM's names


# -- the body of a request ------------------------------------------------------------------


def given(value: Any) -> bool:
    """False for None and the SDK's NOT_GIVEN / omit sentinels."""
    return value is not None and not isinstance(value, openai.NotGiven | openai.Omit)


def request_body(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters of one ``create`` call as the SDK would send them in the JSON body:
    ``extra_body`` merged in (its keys are validated like any other), the transport knobs
    (``TRANSPORT``) dropped, None / NOT_GIVEN values dropped, and every value checked
    (``check_values``)."""
    params = {k: v for k, v in kwargs.items() if k not in TRANSPORT and k != "extra_body"}
    extra = kwargs.get("extra_body")
    if given(extra):
        if not isinstance(extra, Mapping):
            raise bad_request("'extra_body' must be a mapping.", param="extra_body")
        params.update(extra)
    params = {k: v for k, v in params.items() if given(v)}
    check_values(params)
    return params


def check_values(params: Mapping[str, Any]) -> None:
    """Walk every value (without recursion, so depth cannot overflow the stack): a 400 naming
    the path of a string that is not valid Unicode (a lone surrogate such as ``"\\ud800"``,
    which JSON allows and no tokenizer can encode), or of nesting deeper than ``MAX_DEPTH``."""
    stack: list[tuple[str, Any, int]] = [(key, value, 1) for key, value in params.items()]
    while stack:
        path, value, depth = stack.pop()
        if isinstance(value, str):
            if not value.isascii():
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError:
                    raise bad_request(
                        f"Invalid '{path}': the string holds a lone surrogate (invalid Unicode); "
                        "send UTF-8 text.",
                        param=path,
                    ) from None
            continue
        if depth > MAX_DEPTH and isinstance(value, Mapping | list | tuple):
            top = path.split(".")[0].split("[")[0]
            raise bad_request(f"Invalid '{top}': nested more than {MAX_DEPTH} levels deep.",
                              param=top)  # fmt: skip
        if isinstance(value, Mapping):
            for key, item in value.items():
                stack.append((f"{path}.{key}", key, depth + 1))  # keys are strings too
                stack.append((f"{path}.{key}", item, depth + 1))
        elif isinstance(value, list | tuple):
            stack.extend((f"{path}[{i}]", item, depth + 1) for i, item in enumerate(value))


def check_names(
    params: Mapping[str, Any], known: Set[str], refused: Set[str] = frozenset()
) -> None:
    """Every key is one the API knows (else a 400 ``unknown_parameter``) and none is one it
    knows but cannot honour here (``refused``: a 400 ``unsupported_parameter``)."""
    for key in params:
        if key in refused:
            raise unsupported(key)
        if key not in known:
            raise bad_request(f"Unknown parameter: '{key}'.", param=key, code="unknown_parameter")


def check_model(params: Mapping[str, Any], model: str) -> None:
    """``model``, when given, names the model served here (else a 404 ``model_not_found``)."""
    if "model" in params and params["model"] != model:
        raise not_found(
            f"The model '{params['model']}' does not exist here; this engine serves '{model}'.",
            param="model",
            code="model_not_found",
        )


def plain(value: Any) -> Any:
    """A pydantic object (the SDK's types) as the dict it sends; anything else as it is."""
    if hasattr(value, "model_dump"):
        return value.model_dump(exclude_none=True, by_alias=True)
    return value


# -- sampling -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sampling:
    """How a request picks its tokens, validated; ``engine_params`` is the engine's request."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = no cut (vLLM's -1 is read as 0)
    seed: int | None = None
    logit_bias: Mapping[int, float] | None = None  # token id -> added to its logit

    @property
    def greedy(self) -> bool:
        """``temperature=0`` or ``top_p=0``: the most likely token, every time."""
        return self.temperature == 0 or self.top_p == 0

    def choice_seeds(self, n: int) -> list[int | None]:
        """The seed of each of ``n`` choices: the request's own when ``n == 1``; else
        ``nbresponses.runtime.sampling.derived_seeds(seed, n)`` (as ``Engine.sample``), so
        choice ``i`` is exactly the request made alone with ``seed=derived_seeds(seed, n)[i]``
        and the first ``k`` of ``n`` are those of ``n=k`` (for ``k > 1``). Without a seed every
        choice draws from fresh entropy (None)."""
        if n == 1 or self.seed is None:
            return [self.seed] * n
        return list(derived_seeds(self.seed, n))

    def engine_params(
        self,
        *,
        max_tokens: int,
        logprobs: bool = False,
        top_logprobs: int = 0,
        processed_logprobs: bool = False,
        ignore_eos: bool = False,
        stop_token_ids: Sequence[int] = (),
        constraint: ConstraintFactory | None = None,
        seed: int | None = None,
    ) -> SamplingParams:
        """The engine's ``SamplingParams`` for one generation (``seed``: one of
        ``choice_seeds``, when the request has several choices; else the request's own).
        Greedy requests are sent as ``temperature=0`` with no top-p/top-k cut."""
        greedy = self.greedy
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=0.0 if greedy else self.temperature,
            top_p=1.0 if greedy else self.top_p,
            top_k=0 if greedy else self.top_k,
            seed=self.seed if seed is None else seed,
            stop_token_ids=tuple(stop_token_ids),
            ignore_eos=ignore_eos,
            logprobs=logprobs,
            top_logprobs=top_logprobs,
            processed_logprobs=processed_logprobs,
            constraint=constraint,
            logit_bias=dict(self.logit_bias) if self.logit_bias else None,
        )


def parse_sampling(params: Mapping[str, Any]) -> Sampling:
    """``temperature``, ``top_p``, ``top_k``, ``seed`` and ``logit_bias`` of a request (an API
    that has no such field refused it already in ``check_names``)."""
    top_k = integer(params, "top_k", -1, None, 0)
    return Sampling(
        temperature=number(params, "temperature", *TEMPERATURE_RANGE, 1.0),
        top_p=number(params, "top_p", *TOP_P_RANGE, 1.0),
        top_k=max(top_k, 0),
        seed=integer(params, "seed", *SEED_RANGE),
        logit_bias=logit_bias(params),
    )


def logit_bias(params: Mapping[str, Any], key: str = "logit_bias") -> dict[int, float] | None:
    """``{token id: bias}``: ids as integers or digit strings (JSON keys are strings), each
    bias a number in ``LOGIT_BIAS_RANGE``; None when absent or empty."""
    value = params.get(key)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise bad_request(
            f"Invalid type for '{key}': expected an object mapping token ids to biases.",
            param=key,
        )
    low, high = LOGIT_BIAS_RANGE
    out: dict[int, float] = {}
    for token, bias in value.items():
        if isinstance(token, bool) or not (
            (isinstance(token, int) and token >= 0)
            or (isinstance(token, str) and token.isascii() and token.isdigit())
        ):
            raise bad_request(
                f"Invalid '{key}': {token!r} is not a token id (an integer >= 0).", param=key
            )
        if isinstance(bias, bool) or not isinstance(bias, int | float) or not low <= bias <= high:
            raise bad_request(
                f"Invalid '{key}' for token {token}: {bias!r}; each bias must be a number "
                f"between {low:g} and {high:g}.",
                param=key,
            )
        out[int(token)] = float(bias)
    return out or None


def check_token_ids(
    bias: Mapping[int, float] | None, vocab_size: int | None, key: str = "logit_bias"
) -> None:
    """Every biased id is inside the model's vocabulary ``[0, vocab_size)`` (a 400 naming
    ``key`` otherwise); None: the size is unknown and the engine checks."""
    if not bias or vocab_size is None:
        return
    outside = sorted(t for t in bias if t >= vocab_size)
    if outside:
        raise bad_request(
            f"Invalid '{key}': token id {outside[0]} is outside the vocabulary "
            f"(ids 0 to {vocab_size - 1}).",
            param=key,
        )


def logprobs_mode(params: Mapping[str, Any], *, logprobs: bool, ask: str) -> str:
    """vLLM's ``logprobs_mode``: "raw_logprobs" (the default) or "processed_logprobs" (each
    token's logprob under the distribution it was drawn from, reported beside the raw one);
    the processed mode needs logprobs (``ask`` says how this API asks for them)."""
    mode = params.get("logprobs_mode", "raw_logprobs")
    if mode not in LOGPROBS_MODES:
        allowed = " or ".join(f"'{m}'" for m in LOGPROBS_MODES)
        raise bad_request(
            f"Invalid 'logprobs_mode': {mode!r}; it must be {allowed} (logits are not reported).",
            param="logprobs_mode",
        )
    if mode != "raw_logprobs" and not logprobs:
        raise bad_request(f"logprobs_mode '{mode}' needs logprobs: {ask}.", param="logprobs_mode")
    return str(mode)


# -- counts, limits, stops ------------------------------------------------------------------


def logprob_count(params: Mapping[str, Any], key: str) -> int | None:
    """A number of alternatives per token (``top_logprobs``, Completions' ``logprobs``,
    ``prompt_logprobs``): an integer in [0, ``MAX_LOGPROBS``]; None when absent."""
    return integer(params, key, 0, MAX_LOGPROBS)


def token_limit(params: Mapping[str, Any], key: str, low: int = 1) -> int | None:
    """A token budget (``max_output_tokens``, ``max_tokens``, ``max_completion_tokens``): an
    integer >= ``low``; None when absent (the adapter's default applies)."""
    return integer(params, key, low, None)


def choice_count(params: Mapping[str, Any], key: str = "n") -> int:
    """``n``: choices per prompt, an integer in [1, ``MAX_CHOICES``] (1 when absent)."""
    return integer(params, key, 1, MAX_CHOICES, 1)


def stop_strings(params: Mapping[str, Any], key: str = "stop") -> list[str]:
    """``stop``: a string or a list of non-empty strings, any number of them (vLLM accepts
    any number; OpenAI's limit of four would break lm-eval, which sends five)."""
    value = params.get(key)
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list | tuple):
        raise bad_request(f"'{key}' must be a string or a list of strings.", param=key)
    for i, stop in enumerate(stops):
        if not isinstance(stop, str) or not stop:
            raise bad_request(f"Invalid '{key}[{i}]': expected a non-empty string.", param=key)
    return list(stops)


# -- streaming ------------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamOptions:
    """``stream_options``, validated."""

    include_usage: bool = False  # a last chunk with the usage of the whole request
    continuous_usage_stats: bool = False  # vLLM: with include_usage, usage on every chunk
    include_obfuscation: bool = False  # we never pad, so this changes nothing

    @property
    def usage_on_every_chunk(self) -> bool:
        """vLLM's rule: ``continuous_usage_stats`` counts only with ``include_usage``."""
        return self.include_usage and self.continuous_usage_stats


STREAM_OPTIONS = frozenset({"include_usage", "continuous_usage_stats", "include_obfuscation"})


def stream_options(
    params: Mapping[str, Any], *, stream: bool, accepted: Set[str] = STREAM_OPTIONS
) -> StreamOptions:
    """``stream_options``: only with ``stream=True``; an object whose keys are among
    ``accepted`` (the ones this API has) and whose values are booleans."""
    value = plain(params.get("stream_options"))
    if value is None:
        return StreamOptions()
    if not stream:
        raise bad_request("'stream_options' needs stream=True.", param="stream_options")
    if not isinstance(value, Mapping):
        example = sorted(accepted)[0]
        raise bad_request(
            f"'stream_options' must be an object such as {{'{example}': true}}.",
            param="stream_options",
        )
    options = {k: v for k, v in value.items() if v is not None}
    for key, v in options.items():
        if key not in accepted:
            raise unsupported(f"stream_options.{key}")
        if not isinstance(v, bool):
            raise bad_request(f"'stream_options.{key}' must be a boolean.",
                              param=f"stream_options.{key}")  # fmt: skip
    return StreamOptions(**options)
