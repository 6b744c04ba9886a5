"""Chat Completions on the bundled model: the same tokens and logprobs as the Responses path
for the same conversation (streamed or not, in process and over HTTP), ``n`` choices equal to
the request made alone with each derived seed, and ``logit_bias`` before sampling."""

from __future__ import annotations

import pandas as pd
import pytest
from helpers.server import Target

from nbresponses.engine import Engine
from nbresponses.protocol.request import LOGPROBS_INCLUDE, parse_create
from nbresponses.runtime.generator import TokenGenerator
from nbresponses.runtime.sampling import derived_seeds

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]
SYSTEM = "You are a helpful assistant."
QUESTION = "Name three colours of the rainbow."


@pytest.fixture
async def engine(bundled_model):
    engine = Engine(TokenGenerator(bundled_model), store_path="memory")
    yield engine
    await engine.aclose()


def chat_tokens(completion) -> list[tuple[str, float, list[tuple[str, float]]]]:
    return [
        (t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs])
        for t in completion.choices[0].logprobs.content
    ]


def response_tokens(response) -> list[tuple[str, float, list[tuple[str, float]]]]:
    part = response.output[-1].content[0]
    return [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs])
            for t in part.logprobs]  # fmt: skip


async def stream_tokens(stream) -> tuple[str, list[tuple[str, float, list[tuple[str, float]]]]]:
    text, tokens = "", []
    async for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            for t in (choice.logprobs.content or []) if choice.logprobs else []:
                tokens.append((t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs]))
    return text, tokens


@pytest.mark.parametrize("kind", ["inprocess", "http"])
@pytest.mark.parametrize("sampled", [False, True])
async def test_chat_and_responses_give_the_same_tokens_and_logprobs(engine, kind, sampled):
    sampling = {"temperature": 0.8, "top_p": 0.95, "seed": 1234} if sampled else {
        "temperature": 0}  # fmt: skip
    seed = sampling.pop("seed", None)
    extra = {} if seed is None else {"seed": seed}
    with Target(kind, engine.client()) as target:
        sdk = target.openai()
        response = await sdk.responses.create(
            model=engine.model, instructions=SYSTEM, input=QUESTION, max_output_tokens=40,
            include=[LOGPROBS_INCLUDE], top_logprobs=3, extra_body=extra, **sampling,
        )  # fmt: skip
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
        chat = await sdk.chat.completions.create(
            model=engine.model, messages=messages, max_completion_tokens=40, logprobs=True,
            top_logprobs=3, seed=seed, **sampling,
        )  # fmt: skip
        text, streamed = await stream_tokens(
            await sdk.chat.completions.create(
                model=engine.model,
                messages=messages,
                max_tokens=40,
                logprobs=True,
                top_logprobs=3,
                seed=seed,
                stream=True,
                **sampling,
            )
        )
    want = response_tokens(response)
    assert len(want) > 3
    assert chat_tokens(chat) == want  # token for token, float for float
    assert streamed == want
    assert chat.choices[0].message.content == response.output_text == text
    assert chat.usage.prompt_tokens == response.usage.input_tokens
    assert chat.usage.completion_tokens == response.usage.output_tokens
    finish = "length" if response.status == "incomplete" else "stop"
    assert chat.choices[0].finish_reason == finish


async def test_n_choices_are_each_the_request_alone_with_its_derived_seed(engine):
    messages = [{"role": "user", "content": "Write one word."}]
    sdk = engine.openai()
    request = {"model": engine.model, "messages": messages, "max_tokens": 12, "temperature": 1.0,
               "logprobs": True}  # fmt: skip
    many = await sdk.chat.completions.create(**request, n=3, seed=42)
    for choice, seed in zip(many.choices, derived_seeds(42, 3), strict=True):
        alone = await sdk.chat.completions.create(**request, seed=seed)
        assert choice.message.content == alone.choices[0].message.content
        assert choice.logprobs == alone.choices[0].logprobs
    samples = await engine.sample(messages, n=3, seed=42, max_output_tokens=12,
                                  logprobs_mode="raw_logprobs")  # fmt: skip
    assert [c.message.content for c in many.choices] == [s.output_text for s in samples]


def _runtime_applies_logit_bias() -> bool:
    """Whether this checkout's sampler reads ``SamplingParams.logit_bias`` (branch runtime)."""
    import inspect

    from nbresponses.runtime import generator, sampling

    return any("logit_bias" in inspect.getsource(m) for m in (sampling, generator))


@pytest.mark.skipif(
    not _runtime_applies_logit_bias(), reason="the runtime does not apply logit_bias yet"
)
async def test_logit_bias_steers_the_choice(engine):
    sdk = engine.openai()
    messages = [{"role": "user", "content": "Say hello."}]
    plain = await sdk.chat.completions.create(
        model=engine.model, messages=messages, max_tokens=1, temperature=0, logprobs=True
    )
    first = plain.choices[0].logprobs.content[0].token
    family = engine.client().family
    (target,) = family.encode("Banana")[:1]
    assert family.decode([target]) != first
    biased = await sdk.chat.completions.create(
        model=engine.model, messages=messages, max_tokens=1, temperature=0, logprobs=True,
        logit_bias={str(target): 100},
    )  # fmt: skip
    assert biased.choices[0].logprobs.content[0].token == family.decode([target])


async def test_prompt_logprobs_are_the_completions_apis_for_the_rendered_prompt(engine):
    """vLLM's ``prompt_logprobs`` on a chat request: the rendered prompt's ids scored by the
    engine, the very entries ``/v1/completions`` gives for those ids."""
    client = engine.client()
    req = parse_create({"instructions": SYSTEM, "input": QUESTION}, model=engine.model)
    ids = client.family.render(req, req.input).ids
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    sdk = engine.openai()
    chat = await sdk.chat.completions.create(
        model=engine.model, messages=messages, max_tokens=1, temperature=0,
        extra_body={"prompt_logprobs": 2},
    )  # fmt: skip
    completion = await sdk.completions.create(
        model=engine.model, prompt=ids, max_tokens=1, temperature=0,
        extra_body={"prompt_logprobs": 2},
    )  # fmt: skip
    scored = chat.model_extra["prompt_logprobs"]
    assert len(scored) == len(ids) == chat.usage.prompt_tokens and scored[0] is None
    assert scored == completion.choices[0].model_extra["prompt_logprobs"]


async def test_the_frames_give_the_same_rows_for_chat_and_responses(engine):
    """``nbr.logprobs_frame`` of one answer, whichever API produced it, streamed or not."""
    import nbresponses as nbr

    sdk = engine.openai()
    messages = [{"role": "user", "content": QUESTION}]
    response = await sdk.responses.create(
        model=engine.model, input=QUESTION, temperature=0, max_output_tokens=20,
        include=[LOGPROBS_INCLUDE], top_logprobs=3,
    )  # fmt: skip
    chat = await sdk.chat.completions.create(
        model=engine.model, messages=messages, temperature=0, max_tokens=20, logprobs=True,
        top_logprobs=3,
    )  # fmt: skip
    stream = await sdk.chat.completions.create(
        model=engine.model, messages=messages, temperature=0, max_tokens=20, logprobs=True,
        top_logprobs=3, stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = [chunk async for chunk in stream]
    columns = ["token", "logprob"]
    want = nbr.logprobs_frame(response)[columns].reset_index(drop=True)
    assert len(want) == response.usage.output_tokens - (response.status == "completed")
    for frame in (nbr.logprobs_frame(chat), nbr.logprobs_frame(chunks)):
        assert frame[columns].reset_index(drop=True).equals(want)


@pytest.mark.parametrize("max_tokens", [12, 200])  # cut by the budget; ended by the model
async def test_the_frames_give_equal_rows_for_all_three_apis_streamed_or_not(engine, max_tokens):
    """One greedy answer through Responses, Chat Completions and Completions (its prompt the
    chat-rendered ids), each streamed and not: ``logprobs_frame`` and ``top_logprobs_frame``
    give equal frames (``assert_frame_equal``) once the ids these APIs do not share are
    dropped, and ``usage_frame`` the same counts (``cached_tokens`` aside: the prefix cache
    warms between the requests). One difference: when the model ends the answer, Completions
    also gives the end-of-turn token's logprob (vLLM's Completions do too), one row more."""
    import nbresponses as nbr

    client = engine.client()
    req = parse_create({"input": QUESTION}, model=engine.model)
    ids = list(client.family.render(req, req.input).ids)
    sdk = engine.openai()
    common = {"model": engine.model, "temperature": 0}
    messages = [{"role": "user", "content": QUESTION}]
    answers = {}
    for stream in (False, True):
        options = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
        responses = await sdk.responses.create(
            **common, input=QUESTION, max_output_tokens=max_tokens, include=[LOGPROBS_INCLUDE],
            top_logprobs=3, stream=stream,
        )  # fmt: skip
        chat = await sdk.chat.completions.create(
            **common, messages=messages, max_tokens=max_tokens, logprobs=True, top_logprobs=3,
            **options,
        )  # fmt: skip
        completion = await sdk.completions.create(
            **common, prompt=ids, max_tokens=max_tokens, logprobs=3, **options
        )
        for api, answer in (("responses", responses), ("chat", chat), ("completions", completion)):
            answers[api, stream] = [event async for event in answer] if stream else answer

    def rows(frame):
        frame = frame.drop(columns=["response_id", "item_id"])
        for column in frame.select_dtypes("category"):  # categories: the tokens seen
            frame[column] = frame[column].astype(str)
        return frame

    want = rows(nbr.logprobs_frame(answers["responses", False]))
    want_top = rows(nbr.top_logprobs_frame(answers["responses", False]))
    counts = ["model", "status", "input_tokens", "output_tokens", "total_tokens"]
    want_usage = nbr.usage_frame([answers["responses", False]])[counts]
    assert len(want) > 3 and len(want_top) == 3 * len(want)
    assert want_usage.loc[0, "input_tokens"] == len(ids)
    status = want_usage.loc[0, "status"]
    assert status == ("incomplete" if max_tokens == 12 else "completed")
    for key, answer in answers.items():
        got, got_top = rows(nbr.logprobs_frame(answer)), rows(nbr.top_logprobs_frame(answer))
        if key[0] == "completions" and status == "completed":
            # Completions reports the end-of-turn token too (as vLLM does; it is counted in
            # the usage of every API, but Responses and Chat Completions give no logprob for
            # it): one row more, the last, and its alternatives
            eos = client.family.tokenizer.eos_token
            assert list(got["token"].iloc[len(want) :]) == [eos], key
            assert got["position"].iloc[-1] == len(want) and not got["given"].iloc[-1]
            assert (got_top["position"].iloc[len(want_top) :] == len(want)).all(), key
            got, got_top = got.iloc[: len(want)], got_top.iloc[: len(want_top)]
        pd.testing.assert_frame_equal(got, want, obj=str(key))
        pd.testing.assert_frame_equal(got_top, want_top, obj=str(key))
        usage = nbr.usage_frame([answer])[counts]
        pd.testing.assert_frame_equal(usage, want_usage, obj=str(key), check_categorical=False)
