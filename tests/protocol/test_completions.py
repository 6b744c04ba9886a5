"""The Completions adapter (``protocol/completions.py``) tested directly, and its service on
the scripted token source (no model): what reaches the engine for ``n``, seeds, ``top_p``,
``logit_bias`` and stops, the choices' indices, and the usage of every chunk."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from helpers.responses import EOS, client_for, ids
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types import Completion

from nbresponses.protocol.completions import DEFAULT_MAX_TOKENS, KNOWN, parse_completion
from nbresponses.protocol.generation import Sampling, StreamOptions
from nbresponses.runtime import sampling as sampler
from nbresponses.tokens.scripted import Script


def parse(**kwargs: Any):
    return parse_completion({"prompt": "q", **kwargs}, model="m")


def bad(**kwargs: Any) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as err:
        parse(**kwargs)
    return err.value


def test_defaults():
    req = parse()
    assert (req.prompts, req.max_tokens, req.n, req.stop, req.echo) == (
        ["q"], DEFAULT_MAX_TOKENS, 1, [], False
    )  # fmt: skip
    assert req.sampling == Sampling() and req.stream_options == StreamOptions()
    assert req.logprobs is None and req.prompt_logprobs is None


def test_what_lm_eval_and_vllm_clients_send_is_accepted():
    five = ["\n\n", "Question:", "Q:", "</s>", "<|endoftext|>"]  # four until + end of text
    req = parse(
        prompt=[[1, 2, 3], [4, 5]], max_tokens=0, echo=True, logprobs=1, seed=1234, stop=five,
        temperature=0, n=3, logit_bias={"5": -100, 7: 2.5}, top_k=-1, prompt_logprobs=20,
        stream=True, stream_options={"include_usage": True, "continuous_usage_stats": False},
    )  # fmt: skip
    assert req.stop == five and req.n == 3 and req.prompts == [[1, 2, 3], [4, 5]]
    assert req.sampling == Sampling(temperature=0.0, seed=1234, logit_bias={5: -100.0, 7: 2.5})
    assert req.stream_options == StreamOptions(include_usage=True)
    assert req.scores_prompt


@pytest.mark.parametrize(
    ("kwargs", "param", "code"),
    [
        ({"n": 0}, "n", "integer_out_of_range"),
        ({"n": 129}, "n", "integer_out_of_range"),
        ({"best_of": 2}, "best_of", "unsupported_parameter"),
        ({"best_of": 1, "n": 2}, "best_of", None),  # OpenAI's and vLLM's rule: best_of >= n
        ({"presence_penalty": 0.5}, "presence_penalty", "unsupported_parameter"),
        ({"suffix": "x"}, "suffix", "unsupported_parameter"),
        ({"logit_bias": {"x": 1}}, "logit_bias", None),
        ({"logit_bias": {"1": 200}}, "logit_bias", None),
        ({"stop": ["a", ""]}, "stop", None),
        ({"top_k": -2}, "top_k", "integer_out_of_range"),
        ({"prompt_logprobs": 21}, "prompt_logprobs", "integer_out_of_range"),
        ({"max_tokens": 0}, "max_tokens", None),  # generates nothing without echo
        ({"stream_options": {"include_usage": True}}, "stream_options", None),
        ({"stream": True, "stream_options": {"continuous_usage_stats": 1}},
         "stream_options.continuous_usage_stats", None),
        ({"score_method": "fast"}, "score_method", None),
        ({"prompt": [1, -2]}, "prompt[0]", None),
        ({"user": 3}, "user", None),
    ],
)  # fmt: skip
def test_a_bad_value_is_a_400_naming_it(kwargs, param, code):
    err = bad(**kwargs)
    assert (err.status_code, err.param, err.code) == (400, param, code)


# -- the service on a scripted source --------------------------------------------------------


async def test_n_choices_get_derived_seeds_and_their_own_index(tokenizer):
    """Prompt ``i``'s choice ``j`` is index ``i * n + j``, generated with
    ``derived_seeds(seed, n)[j]``; each prompt's tokens count once in the usage."""
    scripts = [Script(ids(tokenizer, w)) for w in ("a", "b c", "d", "e f g")]
    client, source = client_for(tokenizer, *scripts)
    completion = await client.completions.create(
        prompt=["Hello there", "Bye"], n=2, seed=5, temperature=0.8, max_tokens=8
    )
    seeds = sampler.derived_seeds(5, 2)
    assert [p.seed for p in source.params] == seeds * 2
    hello, bye = tokenizer.encode("Hello there"), tokenizer.encode("Bye")
    assert source.prompts == [hello, hello, bye, bye]
    assert [c.index for c in completion.choices] == [0, 1, 2, 3]
    assert [c.text for c in completion.choices] == ["a", "b c", "d", "e f g"]
    usage = completion.usage
    assert usage.prompt_tokens == len(hello) + len(bye)
    generated = sum(len(s.token_ids) for s in scripts)  # the eos counts, as on the engine
    assert (
        usage.completion_tokens == generated
        and usage.total_tokens == generated + usage.prompt_tokens
    )


async def test_one_choice_keeps_its_seed(tokenizer):
    client, source = client_for(tokenizer, "x")
    await client.completions.create(prompt="hi", seed=5, max_tokens=2)
    await client.completions.create(prompt="hi", seed=5, n=1, max_tokens=2)
    assert [p.seed for p in source.params] == [5, 5]


async def test_top_p_zero_is_greedy_on_both_apis_and_never_fails(tokenizer):
    client, source = client_for(tokenizer, "ok")
    response = await client.responses.create(input="hi", top_p=0)
    assert response.status == "completed" and response.top_p == 0  # echoed as given
    await client.completions.create(prompt="hi", top_p=0, max_tokens=2)
    for params in source.params:
        assert (params.temperature, params.top_p) == (0.0, 1.0)
        sampler.validate(params)  # what the engine checks first
    assert source.params[0].top_p == source.params[1].top_p


@pytest.mark.parametrize(
    ("api", "kwargs", "param"),
    [
        ("responses", {"extra_body": {"seed": 2**63}}, "seed"),
        ("completions", {"seed": 2**63}, "seed"),
        ("responses", {"top_logprobs": 21}, "top_logprobs"),
        ("completions", {"logprobs": 21}, "logprobs"),
    ],
)
async def test_the_same_mistake_is_a_400_on_both_and_nothing_runs(tokenizer, api, kwargs, param):
    client, source = client_for(tokenizer, "x")
    first = {"responses": {"input": "hi"}, "completions": {"prompt": "hi"}}[api]
    with pytest.raises(openai.BadRequestError) as err:
        await getattr(client, api).create(**first, **kwargs)
    assert (err.value.status_code, err.value.param) == (400, param)
    assert err.value.code == "integer_out_of_range" and source.prompts == []


async def test_logit_bias_reaches_the_engine_and_ids_must_be_in_the_vocabulary(tokenizer):
    client, source = client_for(tokenizer, "x")
    await client.completions.create(prompt="hi", max_tokens=2, logit_bias={"42": 5, 7: -100})
    assert source.params[-1].logit_bias == {42: 5.0, 7: -100.0}
    await client.completions.create(prompt="hi", max_tokens=2)
    assert source.params[-1].logit_bias is None
    with pytest.raises(openai.BadRequestError) as err:
        await client.completions.create(prompt="hi", logit_bias={str(len(tokenizer)): 1})
    assert err.value.param == "logit_bias" and "outside the vocabulary" in err.value.message
    assert len(source.params) == 2


async def test_any_number_of_stops_cut_the_text(tokenizer):
    client, _ = client_for(tokenizer, Script(ids(tokenizer, "one two three four", eos=False)))
    stops = ["zzz", "yyy", "xxx", "www", "vvv", " three"]
    completion = await client.completions.create(prompt="hi", stop=stops, max_tokens=8)
    assert completion.choices[0].text == "one two"
    assert completion.choices[0].finish_reason == "stop"


async def test_a_stream_of_n_choices_with_usage_on_every_chunk(tokenizer):
    scripts = [Script(ids(tokenizer, "a b c")), Script(ids(tokenizer, "d e"))]
    client, source = client_for(tokenizer, *scripts)
    stream = await client.completions.create(
        prompt="Hello", n=2, seed=3, max_tokens=8, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
    )  # fmt: skip
    chunks: list[Completion] = [c async for c in stream]
    prompt_tokens = len(tokenizer.encode("Hello"))
    *parts, last = chunks
    assert last.choices == [] and last.usage.prompt_tokens == prompt_tokens
    assert last.usage.completion_tokens == sum(len(s.token_ids) for s in scripts)
    texts = {0: "", 1: ""}
    counted = {0: 0, 1: 0}
    for chunk in parts:
        (choice,) = chunk.choices
        texts[choice.index] += choice.text
        usage = chunk.usage  # this choice's usage so far, as vLLM reports it
        assert usage.prompt_tokens == prompt_tokens
        assert usage.completion_tokens >= counted[choice.index]
        counted[choice.index] = usage.completion_tokens
    assert texts == {0: "a b c", 1: "d e"}
    assert counted == {0: len(scripts[0].token_ids), 1: len(scripts[1].token_ids)}
    assert [p.seed for p in source.params] == sampler.derived_seeds(3, 2)


async def test_usage_only_at_the_end_without_continuous_stats(tokenizer):
    client, _ = client_for(tokenizer, "a b")
    for options in ({"include_usage": True}, {"include_usage": True,
                                              "continuous_usage_stats": False}):  # fmt: skip
        chunks = [
            c
            async for c in await client.completions.create(
                prompt="hi", max_tokens=4, stream=True, stream_options=options
            )
        ]
        assert all(c.usage is None for c in chunks[:-1]) and chunks[-1].usage is not None


async def test_echo_with_n_scores_the_prompt_once(tokenizer):
    """Every choice echoes its prompt with the same logprobs, scored once for all."""
    client, source = client_for(tokenizer, "a", "b", "c")
    prompt = [EOS, *tokenizer.encode("Hello there")]
    completion = await client.completions.create(
        prompt=prompt,
        n=3,
        seed=1,
        echo=True,
        logprobs=1,
        max_tokens=1,
        extra_body={"score_method": "decode"},  # (a scripted source scores by decoding)
    )
    assert len(completion.choices) == 3
    echoed = [c.logprobs.token_logprobs[: len(prompt)] for c in completion.choices]
    assert echoed[0] == echoed[1] == echoed[2] and echoed[0][0] is None
    scorings = [p for p in source.params if p.forced_tokens]
    assert len(scorings) == 1 and len(source.params) == 4  # one scoring, three generations


# -- any body: a 400 (or 404) naming what was wrong, or a request ---------------------------

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(st.characters(codec=None, exclude_categories=()), max_size=6)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=4),
    max_leaves=10,
)  # fmt: skip
KEYS = sorted(KNOWN | {"extra_body", "timeout", "bogus"})


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.dictionaries(st.sampled_from(KEYS), JSON, max_size=6))
def test_any_body_is_a_named_4xx_or_a_request(body):
    try:
        parse_completion(body, model="m")
    except (openai.BadRequestError, openai.NotFoundError) as err:
        assert err.param is not None and err.body["param"] == err.param  # ("" names "")
