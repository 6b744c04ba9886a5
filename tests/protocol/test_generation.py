"""The request core (``protocol/generation.py``) under every API: the same value gets the same
answer whichever API carries it (the same 400, naming the parameter, with the same message and
code; or the same engine request), and nothing the core accepts can fail in the engine's
sampler (so no client mistake ends as a ``failed`` response).

The APIs are adapters in ``ADAPTERS``: each says how it parses and what it calls the shared
fields. A new API (Chat Completions) joins every table by adding itself there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nbresponses.protocol import generation
from nbresponses.protocol.chat import parse_chat
from nbresponses.protocol.completions import parse_completion
from nbresponses.protocol.generation import (
    MAX_LOGPROBS,
    SEED_RANGE,
    Sampling,
    check_token_ids,
    parse_sampling,
    request_body,
    stop_strings,
    stream_options,
)
from nbresponses.protocol.request import parse_create, sampling_of
from nbresponses.runtime import sampling as sampler
from nbresponses.tokens.contract import SamplingParams


@dataclass(frozen=True)
class Adapter:
    """One API's parser, its required field, and its names for the shared fields."""

    name: str
    parse: Callable[[Mapping[str, Any]], Any]
    required: Mapping[str, Any]
    top_logprobs: str  # the field that asks for alternatives per token
    token_limit: str
    token_floor: int

    def run(self, **fields: Any) -> Any:
        return self.parse({**self.required, **fields})

    def engine_params(self, **fields: Any) -> SamplingParams:
        """What the engine would be asked for (the adapter's own path to the core)."""
        req = self.run(**fields)
        if self.name == "responses":
            return sampling_of(req).engine_params(max_tokens=16, top_logprobs=req.top_logprobs)
        if self.name == "chat":
            return req.sampling.engine_params(max_tokens=16, top_logprobs=req.top_logprobs)
        return req.sampling.engine_params(max_tokens=req.max_tokens, top_logprobs=req.logprobs or 0)


ADAPTERS = [
    Adapter(
        "responses",
        lambda p: parse_create(p, model="m"),
        {"input": "q"},
        "top_logprobs",
        "max_output_tokens",
        1,
    ),
    Adapter(
        "completions",
        lambda p: parse_completion(p, model="m"),
        {"prompt": "q"},
        "logprobs",
        "max_tokens",
        0,
    ),
    Adapter(
        "chat",
        lambda p: parse_chat(p, model="m"),
        {"messages": [{"role": "user", "content": "q"}], "logprobs": True},
        "top_logprobs",
        "max_completion_tokens",
        1,
    ),
]
APIS = pytest.mark.parametrize("api", ADAPTERS, ids=lambda a: a.name)


def refusal(call: Callable[[], Any]) -> tuple[int, str | None, str | None, str]:
    with pytest.raises(openai.BadRequestError) as err:
        call()
    e = err.value
    assert e.body == {"message": e.message, "type": "invalid_request_error", "param": e.param,
                      "code": e.code}  # fmt: skip
    return e.status_code, e.param, e.code, e.message


# The same bad value under the same name: the same 400 on every API, word for word.
SHARED_BAD = [
    ("temperature", 2.5, "decimal_out_of_range"),
    ("temperature", -0.1, "decimal_out_of_range"),
    ("temperature", math.nan, "decimal_out_of_range"),
    ("temperature", math.inf, "decimal_out_of_range"),
    ("temperature", "hot", None),
    ("temperature", True, None),
    ("top_p", 1.5, "decimal_out_of_range"),
    ("top_p", -0.1, "decimal_out_of_range"),
    ("top_p", "0.5", None),
    ("seed", 2**63, "integer_out_of_range"),
    ("seed", 2**64 - 1, "integer_out_of_range"),
    ("seed", -(2**63) - 1, "integer_out_of_range"),
    ("seed", 1.5, None),
    ("seed", True, None),
    ("stream", "yes", None),
    ("stream_options", {"include_obfuscation": False}, None),  # without stream=True
    ("extra_body", [1], None),
    ("frobnicate", 1, "unknown_parameter"),
]


@APIS
@pytest.mark.parametrize(("key", "value", "code"), SHARED_BAD)
def test_a_bad_shared_value_is_the_same_400_on_every_api(api, key, value, code):
    got = refusal(lambda: api.run(**{key: value}))
    assert got[:3] == (400, key, code)
    others = [refusal(lambda a=a: a.run(**{key: value})) for a in ADAPTERS]
    assert all(other == got for other in others), others


def test_the_model_and_a_lone_surrogate_are_refused_alike():
    for api in ADAPTERS:
        with pytest.raises(openai.NotFoundError) as err:
            api.run(model="gpt-x")
        assert (err.value.param, err.value.code) == ("model", "model_not_found")
        status, param, _, message = refusal(lambda a=api: a.run(user="\ud800"))
        assert (status, param) == (400, "user") and "lone surrogate" in message


@APIS
@pytest.mark.parametrize("count", [-1, MAX_LOGPROBS + 1, 1.0, "3"])
def test_logprob_counts_have_one_bound(api, count):
    status, param, code, message = refusal(lambda: api.run(**{api.top_logprobs: count}))
    assert (status, param) == (400, api.top_logprobs)
    if isinstance(count, int):
        assert code == "integer_out_of_range" and f"between 0 and {MAX_LOGPROBS}" in message
    # the same words on every API, but for the field's name
    for other in ADAPTERS:
        again = refusal(lambda o=other: o.run(**{o.top_logprobs: count}))
        assert again[3].replace(other.top_logprobs, "F") == message.replace(api.top_logprobs, "F")


@APIS
def test_twenty_logprobs_are_accepted_everywhere(api):
    assert api.engine_params(**{api.top_logprobs: MAX_LOGPROBS}).top_logprobs == MAX_LOGPROBS
    assert MAX_LOGPROBS == sampler.MAX_TOP_LOGPROBS == 20  # one limit: the engine's


@APIS
def test_a_token_limit_below_its_floor_is_a_400(api):
    status, param, code, message = refusal(lambda: api.run(**{api.token_limit: -1}))
    assert (status, param, code) == (400, api.token_limit, "integer_out_of_range")
    assert f"at least {api.token_floor}" in message


@APIS
@pytest.mark.parametrize(
    "fields", [{"top_p": 0}, {"top_p": 0.0}, {"temperature": 0}, {"top_p": 0, "temperature": 2}]
)
def test_top_p_zero_is_greedy_on_every_api(api, fields):
    """top_p=0 keeps the single most likely token: greedy, as temperature=0 is, on every API;
    the engine gets settings its sampler runs (never a top_p it refuses)."""
    params = api.engine_params(**fields)
    assert (params.temperature, params.top_p, params.top_k) == (0.0, 1.0, 0)
    sampler.validate(params)
    assert api.engine_params(**fields) == ADAPTERS[0].engine_params(**fields)


@APIS
@pytest.mark.parametrize("seed", [SEED_RANGE[0], -1, 0, SEED_RANGE[1]])
def test_every_int64_seed_reaches_the_engine(api, seed):
    params = api.engine_params(seed=seed, temperature=0.7)
    assert params.seed == seed and (params.temperature, params.top_p) == (0.7, 1.0)
    sampler.validate(params)
    sampler.make_rng(params)  # the sampler's generator takes it


@APIS
def test_stream_options_follow_one_rule(api):
    status, param, code, _ = refusal(
        lambda: api.run(stream=True, stream_options={"include_obfuscation": "no"})
    )
    assert (status, param, code) == (400, "stream_options.include_obfuscation", None)
    status, param, code, _ = refusal(lambda: api.run(stream=True, stream_options={"x": True}))
    assert (status, param, code) == (400, "stream_options.x", "unsupported_parameter")
    status, param, _, _ = refusal(lambda: api.run(stream=True, stream_options=[1]))
    assert (status, param) == (400, "stream_options")
    api.run(stream=True, stream_options={"include_obfuscation": False})  # accepted by both


# -- the core's rules, directly -------------------------------------------------------------


def test_choice_seeds_are_the_seed_alone_and_derived_seeds_for_several():
    assert Sampling(seed=7).choice_seeds(1) == [7]
    assert Sampling(seed=7).choice_seeds(3) == sampler.derived_seeds(7, 3)
    assert Sampling(seed=7).choice_seeds(2) == sampler.derived_seeds(7, 3)[:2]
    assert Sampling().choice_seeds(3) == [None, None, None]
    assert Sampling(seed=7).engine_params(max_tokens=1, seed=11).seed == 11


@pytest.mark.parametrize(
    ("bias", "want"),
    [
        ({"5": 1}, {5: 1.0}),
        ({5: -100, "49151": 100}, {5: -100.0, 49151: 100.0}),
        ({"7": 0.5}, {7: 0.5}),
        ({}, None),
    ],
)
def test_logit_bias_keys_are_ids_and_values_numbers(bias, want):
    assert parse_sampling({"logit_bias": bias}).logit_bias == want
    params = Sampling(logit_bias=want).engine_params(max_tokens=1)
    assert params.logit_bias == want


BAD_BIASES = [
    {"a": 1}, {"-1": 1}, {-1: 1}, {True: 1}, {"5": 101}, {"5": -100.5}, {"5": "1"},
    {"5": True}, {"5": math.nan}, {"\u0663": 1}, [1, 2], "5",
]  # fmt: skip


@pytest.mark.parametrize("bias", BAD_BIASES)
def test_a_bad_logit_bias_is_a_400_naming_it(bias):
    status, param, _, _ = refusal(lambda: parse_sampling({"logit_bias": bias}))
    assert (status, param) == (400, "logit_bias")


def test_logit_bias_ids_must_be_inside_the_vocabulary():
    check_token_ids({0: 1.0, 99: 1.0}, 100)
    check_token_ids({10**9: 1.0}, None)  # unknown size: the engine checks
    status, param, _, message = refusal(lambda: check_token_ids({5: 1.0, 100: 1.0}, 100))
    assert (status, param) == (400, "logit_bias") and "100" in message and "0 to 99" in message


def test_any_number_of_stop_strings():
    assert stop_strings({"stop": "x"}) == ["x"]
    five = ["\n\n", "Question:", "</s>", "<|im_end|>", "<|endoftext|>"]  # lm-eval's
    assert stop_strings({"stop": five}) == five
    assert stop_strings({"stop": [str(i) for i in range(100)]}) == [str(i) for i in range(100)]
    for bad in ([""], ["a", 1], 3, {"a": 1}):
        assert refusal(lambda b=bad: stop_strings({"stop": b}))[1] == "stop"


def test_n_is_bounded():
    assert generation.choice_count({}) == 1
    assert generation.choice_count({"n": generation.MAX_CHOICES}) == generation.MAX_CHOICES
    for bad in (0, -1, generation.MAX_CHOICES + 1, 1.0, True):
        assert refusal(lambda b=bad: generation.choice_count({"n": b}))[1] == "n"


def test_continuous_usage_counts_only_with_include_usage():
    """vLLM's rule: usage on every chunk needs both flags; either one alone is accepted."""
    both = stream_options(
        {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}, stream=True
    )
    assert both.usage_on_every_chunk
    alone = stream_options({"stream_options": {"continuous_usage_stats": True}}, stream=True)
    assert not alone.usage_on_every_chunk and not alone.include_usage
    off = stream_options({"stream_options": {"continuous_usage_stats": False}}, stream=True)
    assert off == generation.StreamOptions()


def test_request_body_merges_extra_body_and_drops_transport():
    body = request_body(
        {"a": 1, "timeout": 3, "extra_headers": {}, "extra_body": {"b": 2, "a": 5}, "c": None}
    )
    assert body == {"a": 5, "b": 2}
    with pytest.raises(openai.BadRequestError):
        request_body({"x": [[[[]]]] * 1, "y": _nested(generation.MAX_DEPTH + 1)})


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


# -- nothing accepted fails in the sampler --------------------------------------------------

JSONISH = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**65), max_value=2**65)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=3)
)
FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "temperature": JSONISH | st.floats(0, 2),
        "top_p": JSONISH | st.floats(0, 1) | st.just(0),
        "seed": JSONISH,
        "stream": st.booleans(),
    },
)


@APIS
@settings(max_examples=300, deadline=None)
@given(fields=FIELDS, top=JSONISH | st.integers(0, 20))
def test_what_is_accepted_runs_in_the_sampler(api, fields, top):
    """Any values: either a 400 naming a parameter, or an engine request the sampler takes."""
    fields = {**fields, api.top_logprobs: top}
    try:
        params = api.engine_params(**fields)
    except openai.BadRequestError as err:
        assert err.status_code == 400 and err.param
        return
    sampler.validate(params)
    sampler.make_rng(params)
