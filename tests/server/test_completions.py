"""``/v1/completions``: OpenAI's legacy Completions API with vLLM's prompt logprobs, over HTTP
and in process. Prompt logprobs are the engine's scoring, float for float; generation is the
engine's; the shapes are the openai SDK's; errors are named 4xx."""

from __future__ import annotations

import asyncio
import json

import httpx2
import openai
import pytest
from helpers.server import ThreadedServer
from openai.types import Completion

from nbresponses.engine import Engine
from nbresponses.runtime.generator import TokenGenerator
from nbresponses.runtime.sampling import derived_seeds
from nbresponses.tokens.contract import SamplingParams

pytestmark = pytest.mark.timeout(120)
TEXTS = ("The sea was calm and the sky was grey.", "Two plus two is four.", "Hello")
KEY = "sk-completions-test"


def document(engine: Engine, text: str) -> list[int]:
    """The ids ``engine.score(text)`` scores: its end-of-text start, then the text's tokens."""
    return [engine.generator.eos_token_ids[0], *engine.client().family.encode(text)]


def score_logprobs(scoring) -> list[float]:
    return [lp.logprob for lp in scoring.output[0].content[0].logprobs]


def error_of(response: httpx2.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


async def test_lm_eval_requests_read_the_engines_scoring_bit_for_bit(fused_engine):
    """The body lm-evaluation-harness's ``local-completions`` posts (token ids, echo, one
    generated token), and the score-only variant with max_tokens 0, over real HTTP."""
    prompts = [document(fused_engine, t) for t in TEXTS]
    want = {
        method: [score_logprobs(await fused_engine.score(t, method=method)) for t in TEXTS]
        for method in ("prefill", "decode")
    }
    lm_eval = {"model": fused_engine.model, "prompt": prompts, "max_tokens": 1, "echo": True,
               "logprobs": 1, "temperature": 0, "seed": 1234}  # fmt: skip
    with ThreadedServer(fused_engine.client()) as server:
        async with httpx2.AsyncClient(base_url=server.base_url, timeout=60) as http:
            for max_tokens in (1, 0):
                for method in ("prefill", "decode"):
                    body = {**lm_eval, "max_tokens": max_tokens}
                    if method == "decode":
                        body["score_method"] = "decode"
                    response = await http.post("/completions", json=body)
                    assert response.status_code == 200, response.text
                    # read as lm-eval reads it: plain JSON (the first token's logprob is
                    # null, as OpenAI and vLLM send it, which the SDK's type calls a float)
                    completion = response.json()
                    assert completion["object"] == "text_completion"
                    choices = sorted(completion["choices"], key=lambda c: c["index"])
                    assert [c["index"] for c in choices] == [0, 1, 2]
                    for choice, ids, scored in zip(choices, prompts, want[method], strict=True):
                        lps = choice["logprobs"]
                        assert len(lps["tokens"]) == len(ids) + max_tokens
                        assert lps["token_logprobs"][0] is None and lps["top_logprobs"][0] is None
                        assert lps["token_logprobs"][1 : len(ids)] == scored  # bit for bit
                        # lm-eval's own reading: ctxlen = 1, the generated token dropped
                        if max_tokens == 1:
                            assert sum(lps["token_logprobs"][1:-1]) == sum(scored)
                        assert choice["finish_reason"] == "length"
                        for tok, top, lp in zip(
                            lps["tokens"][1:], lps["top_logprobs"][1:], lps["token_logprobs"][1:],
                            strict=True,
                        ):  # fmt: skip
                            assert top[tok] == lp and 1 <= len(top) <= 2  # top-1 plus itself
                    assert completion["usage"]["prompt_tokens"] == sum(map(len, prompts))
                    assert completion["usage"]["completion_tokens"] == 3 * max_tokens


async def test_vllm_prompt_logprobs_carry_rank_and_entropy_of_the_scoring(fused_engine):
    ids = document(fused_engine, TEXTS[0])
    scoring = await fused_engine.score(TEXTS[0], top_logprobs=3, method="prefill")
    client = fused_engine.openai()
    completion = await client.completions.create(
        model=fused_engine.model, prompt=ids, max_tokens=0, echo=True,
        extra_body={"prompt_logprobs": 3},
    )  # fmt: skip
    positions = completion.choices[0].model_extra["prompt_logprobs"]
    assert completion.choices[0].logprobs is None  # not asked for
    assert positions[0] is None and len(positions) == len(ids)
    for position, token_id, lp in zip(
        positions[1:], ids[1:], scoring.output[0].content[0].logprobs, strict=True
    ):
        own = position[str(token_id)]
        assert own["logprob"] == lp.logprob and own["rank"] == lp.rank
        assert own["entropy"] == lp.entropy and own["decoded_token"] == lp.token
        tops = [t.logprob for t in lp.top_logprobs]
        others = [v for k, v in position.items() if k != str(token_id)]
        assert len(others) in (2, 3)  # the top 3, less the prompt's token when among them
        assert all(v["logprob"] == tops[v["rank"] - 1] for v in others)


async def test_generation_is_the_engines_and_streams_as_openai_does(fused_engine):
    ids = document(fused_engine, "Once upon a time")
    params = SamplingParams(max_tokens=12, temperature=0, logprobs=True, top_logprobs=2,
                            ignore_eos=True)  # fmt: skip
    steps = [s async for s in fused_engine.generator.generate(ids, params)]
    streamed = [lp.logprob for s in steps for lp in s.logprobs]
    client = fused_engine.openai()
    kwargs = dict(model=fused_engine.model, prompt=ids, max_tokens=12, temperature=0, logprobs=2,
                  extra_body={"ignore_eos": True})  # fmt: skip
    whole = await client.completions.create(**kwargs)
    choice = whole.choices[0]
    assert choice.logprobs.token_logprobs == streamed
    assert choice.text == fused_engine.client().family.decode(
        [t for s in steps for t in s.token_ids]
    )
    assert choice.finish_reason == "length" and whole.usage.completion_tokens == 12
    # text offsets point into the choice's text
    for token, offset in zip(choice.logprobs.tokens, choice.logprobs.text_offset, strict=True):
        assert choice.text[offset : offset + len(token)] == token

    chunks = [
        c
        async for c in await client.completions.create(
            **kwargs, stream=True, stream_options={"include_usage": True}
        )
    ]
    assert all(isinstance(c, Completion) for c in chunks)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    texts = [c.choices[0] for c in chunks[:-1]]
    assert "".join(c.text for c in texts) == choice.text
    assert [lp for c in texts for lp in c.logprobs.token_logprobs] == streamed
    assert [c.finish_reason for c in texts][-1] == "length"
    assert all(c.finish_reason is None for c in texts[:-1])


async def test_echo_stop_and_seed(fused_engine):
    client = fused_engine.openai()
    base = dict(model=fused_engine.model, prompt="The weather today", max_tokens=16, temperature=0,
                extra_body={"ignore_eos": True})  # fmt: skip
    full = (await client.completions.create(**base)).choices[0].text
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    cut = await client.completions.create(**base, stop=[stop, "never-there"])
    assert cut.choices[0].text == full[: full.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    chunks = [c async for c in await client.completions.create(**base, stop=stop, stream=True)]
    assert "".join(c.choices[0].text for c in chunks) == full[: full.index(stop)]
    assert chunks[-1].choices[0].finish_reason == "stop"

    echo = await client.completions.create(**base, echo=True)
    assert echo.choices[0].text == "The weather today" + full

    sampled = dict(base, temperature=1.0, seed=7)
    one = await client.completions.create(**sampled)
    two = await client.completions.create(**sampled)
    assert one.choices[0].text == two.choices[0].text


async def test_the_sync_sdk_and_several_prompts(fused_engine, tokenizer):
    client = fused_engine.openai(sync=True)
    completion = await asyncio.to_thread(
        client.completions.create,
        model=fused_engine.model, prompt=["Hello there", "General"], max_tokens=3, temperature=0,
    )  # fmt: skip
    assert [c.index for c in completion.choices] == [0, 1]
    assert completion.usage.prompt_tokens == len(tokenizer.encode("Hello there")) + len(
        tokenizer.encode("General")
    )


def test_bad_requests_are_named_4xx_never_500(fused_engine):
    ids = document(fused_engine, TEXTS[0])
    context = fused_engine.generator.context_length
    good = {"model": fused_engine.model, "prompt": "hi", "max_tokens": 2}
    wrong = {
        "n": (0, 400, "n"),
        "best_of": (3, 400, "best_of"),
        "logit_bias": ({"5": 101}, 400, "logit_bias"),
        "suffix": ("x", 400, "suffix"),
        "max_tokens": (-1, 400, "max_tokens"),
        "logprobs": (21, 400, "logprobs"),
        "prompt_logprobs": ("3", 400, "prompt_logprobs"),
        "temperature": (3, 400, "temperature"),
        "seed": (2**63, 400, "seed"),  # int64, as on every API
        "top_p": (1.5, 400, "top_p"),
        "stop": (["a", "b", "c", "d", ""], 400, "stop"),  # any number, none empty
        "echo": ("yes", 400, "echo"),
        "stream_options": ({"include_usage": True}, 400, "stream_options"),
        "score_method": ("fast", 400, "score_method"),
        "frobnicate": (1, 400, "frobnicate"),
        "model": ("gpt-x", 404, "model"),
    }
    with ThreadedServer(fused_engine.client(), api_key=KEY) as server, server.http() as http:
        auth = {"authorization": f"Bearer {KEY}"}
        assert "API key" in error_of(http.post("/v1/completions", json=good), 401)["message"]
        assert error_of(http.post("/tokenize", json={"prompt": "hi"}), 401)
        for key, (value, status, param) in wrong.items():
            err = error_of(http.post("/v1/completions", json={**good, key: value}, headers=auth),
                           status)  # fmt: skip
            assert err["param"] == param, (key, err)
        for prompt in ([], "", [[]], [1.5], [-1], [[1, 2], "x", None], {"a": 1}):
            err = error_of(
                http.post("/v1/completions", json={**good, "prompt": prompt}, headers=auth), 400
            )
            assert err["param"].startswith("prompt"), (prompt, err)
        err = error_of(http.post("/v1/completions", json={**good, "max_tokens": 0}, headers=auth),
                       400)  # fmt: skip
        assert "echo" in err["message"]
        too_long = {**good, "prompt": ids * (context // len(ids) + 1), "echo": True}
        err = error_of(http.post("/v1/completions", json=too_long, headers=auth), 400)
        assert err["code"] == "context_length_exceeded"
        outside = {**good, "prompt": [1, 10**7], "echo": True, "logprobs": 0}
        assert error_of(http.post("/v1/completions", json=outside, headers=auth), 400)
        err = error_of(http.post("/v1/completions", content=b'{"prompt": ', headers=auth), 400)
        assert "JSON" in err["message"]
        # the tokenizer routes, as vLLM serves them
        tokens = http.post("/tokenize", json={"prompt": TEXTS[1]}, headers=auth).json()
        assert tokens["tokens"] == ids_of(fused_engine, TEXTS[1]) and tokens["count"] > 0
        assert tokens["max_model_len"] == context
        text = http.post("/detokenize", json={"tokens": tokens["tokens"]}, headers=auth).json()
        assert text == {"prompt": TEXTS[1]}
        err = error_of(http.post("/tokenize", json={"prompt": 3}, headers=auth), 400)
        assert err["param"] == "prompt"


def ids_of(engine: Engine, text: str) -> list[int]:
    return engine.client().family.encode(text)


async def test_a_failing_request_leaves_the_others_alone(fused_engine):
    client = fused_engine.openai()
    fine = dict(model=fused_engine.model, prompt="Hello", max_tokens=8, temperature=0,
                extra_body={"ignore_eos": True})  # fmt: skip
    alone = await client.completions.create(**fine)
    results = await asyncio.gather(
        client.completions.create(**fine),
        client.completions.create(
            model=fused_engine.model, prompt=[[1, 2], [3, 10**7]], max_tokens=4
        ),
        client.completions.create(**fine),
        return_exceptions=True,
    )
    assert isinstance(results[1], openai.BadRequestError)
    assert [r.choices[0].text for r in (results[0], results[2])] == [alone.choices[0].text] * 2


async def test_a_stream_left_early_frees_the_engine(fused_engine):
    client = fused_engine.openai()
    stream = await client.completions.create(
        model=fused_engine.model, prompt="Hello", max_tokens=200, stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    async for _chunk in stream:
        break
    await stream.close()
    for _ in range(200):
        if fused_engine.generator.running == 0:
            break
        await asyncio.sleep(0.02)
    assert fused_engine.generator.running == 0


def test_wire_format_is_openais(fused_engine):
    with ThreadedServer(fused_engine.client()) as server, server.http() as http:
        body = http.post(
            "/v1/completions",
            json={"prompt": "hi", "max_tokens": 3, "stream": True, "ignore_eos": True},
        )
        assert body.headers["content-type"].startswith("text/event-stream")
        frames = body.text.split("\n\n")
        assert frames[-2:] == ["data: [DONE]", ""]
        chunks = [json.loads(frame.removeprefix("data: ")) for frame in frames[:-2]]
        assert all(frame.startswith("data: ") for frame in frames[:-2])
        # OpenAI streams "finish_reason": null until the last chunk (the SDK's type says
        # Literal and reads it leniently); that last chunk validates strictly
        assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 2 + ["length"]
        assert Completion.model_validate(chunks[-1]).object == "text_completion"


def test_a_stream_that_fails_after_it_began_says_so_in_band(fused_engine):
    """Ids outside the vocabulary are found when the prompt reaches the engine: the stream has
    begun, so the error comes as OpenAI's ``data: {"error": ...}`` frame, then ``[DONE]``."""
    bad = {"prompt": [[1, 2], [3, 10**7]], "max_tokens": 2, "stream": True}
    with ThreadedServer(fused_engine.client()) as server, server.http() as http:
        body = http.post("/v1/completions", json=bad)
        frames = body.text.split("\n\n")
        assert frames[-2:] == ["data: [DONE]", ""]
        errors = [json.loads(f[len("data: ") :]) for f in frames if '"error"' in f]
        assert len(errors) == 1 and errors[0]["error"]["param"] == "prompt"
        with pytest.raises(openai.APIError):
            for _ in server.openai(sync=True).completions.create(model=fused_engine.model, **bad):
                pass


async def test_n_choices_are_the_seeded_requests_alone_and_share_one_prefill(tiny_fused, tokenizer):
    """``n`` choices of one prompt are admitted in one round and share its prefill (no prefix
    cache here: only a shared prefill can reuse the prompt), and choice ``j`` is bit for bit the
    prompt sent alone with ``seed=derived_seeds(seed, n)[j]``, streamed or not."""
    engine = Engine(
        TokenGenerator(tiny_fused, tokenizer=tokenizer, prefix_cache_bytes=0), store_path="memory"
    )
    try:
        client = engine.openai()
        ids = document(engine, "Once upon a time")
        kwargs = dict(model=engine.model, prompt=ids, max_tokens=10, temperature=1.3, logprobs=2,
                      extra_body={"ignore_eos": True})  # fmt: skip
        many = await client.completions.create(**kwargs, n=4, seed=11)
        assert [c.index for c in many.choices] == [0, 1, 2, 3]
        assert many.usage.prompt_tokens == len(ids) and many.usage.completion_tokens == 40
        assert many.usage.prompt_tokens_details.cached_tokens == len(ids)  # one prefill
        assert len({c.text for c in many.choices}) > 1  # the seeds draw different answers
        for seed, choice in zip(derived_seeds(11, 4), many.choices, strict=True):
            alone = (await client.completions.create(**kwargs, seed=seed)).choices[0]
            assert alone.text == choice.text
            assert alone.logprobs.token_logprobs == choice.logprobs.token_logprobs
            assert alone.logprobs.top_logprobs == choice.logprobs.top_logprobs
        options = {"include_usage": True, "continuous_usage_stats": True}
        stream = await client.completions.create(
            **kwargs, n=4, seed=11, stream=True, stream_options=options
        )
        chunks = [c async for c in stream]
        texts = ["" for _ in range(4)]
        for chunk in chunks[:-1]:
            texts[chunk.choices[0].index] += chunk.choices[0].text
            assert chunk.usage.prompt_tokens == len(ids)  # vLLM's per-choice usage so far
        assert texts == [c.text for c in many.choices]
        assert chunks[-1].usage.completion_tokens == 40
    finally:
        await engine.aclose()
