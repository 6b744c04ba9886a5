"""Scoring on a server: ``nbr.RemoteEngine`` against ``nbresponses serve`` (started here) gives
the scorings ``engine.score`` gives in the kernel, float for float, in the same frames."""

from __future__ import annotations

import openai
import pandas as pd
import pytest
from helpers.server import ThreadedServer

import nbresponses as nbr
from nbresponses.analysis.remote import RemoteEngine, _from_echo, _from_prompt_logprobs

pytestmark = pytest.mark.timeout(180)
TEXTS = ["The sea was calm and the sky was grey.", "Two plus two is four.", "Hello there"]
KEY = "sk-remote-test"


@pytest.fixture
async def remote(fused_engine):
    with ThreadedServer(fused_engine.client(), api_key=KEY) as server:
        eos = fused_engine.generator.eos_token_ids[0]
        async with RemoteEngine(server.base_url, api_key=KEY, document_start=eos) as remote:
            yield remote


def entries(scoring):
    return [
        (lp.token, lp.bytes, lp.logprob, lp.rank, lp.entropy,
         [(t.token, t.bytes, t.logprob) for t in lp.top_logprobs])
        for lp in scoring.output[0].content[0].logprobs
    ]  # fmt: skip


async def test_remote_scorings_are_the_kernels(fused_engine, remote):
    assert await remote.scoring.resolve_model() == fused_engine.model
    assert remote.model == fused_engine.model  # the server's first model, asked for
    local = await fused_engine.score(TEXTS[0], top_logprobs=3, method="prefill")
    far = await remote.score(TEXTS[0], top_logprobs=3)
    assert entries(far) == entries(local)  # logprob, rank, entropy, alternatives: all equal
    assert far.output_text == local.output_text
    assert far.metadata["nbresponses.server"].startswith("127.0.0.1:")
    # a continuation, computed by decode steps on both sides
    local = await fused_engine.score("Is the sea calm?", " Yes", top_logprobs=2)
    far = await remote.score("Is the sea calm?", " Yes", top_logprobs=2, method="decode")
    assert entries(far) == entries(local)
    assert far.usage.input_tokens == local.usage.input_tokens
    # the frames read both alike
    columns = ["token", "logprob", "rank", "entropy", "given"]
    pd.testing.assert_frame_equal(
        nbr.logprobs_frame(far)[columns], nbr.logprobs_frame(local)[columns]
    )


async def test_choose_and_score_frame_switch_by_one_line(fused_engine, remote):
    options = [" Yes", " No", " Maybe"]
    for where in (fused_engine, remote):  # the notebook's one line: which of the two it holds
        frame = await where.choose("Is the sea calm?", options, method="prefill")
        assert list(frame.index) == options and abs(frame["prob"].sum() - 1) < 1e-9
        if where is fused_engine:
            local_choice = frame
    pd.testing.assert_frame_equal(frame, local_choice)
    far = await remote.score_frame(TEXTS, top_logprobs=1, progress=False)
    near = await fused_engine.score_frame(TEXTS, top_logprobs=1, method="prefill", progress=False)
    columns = ["document", "token", "logprob", "rank", "entropy"]
    pd.testing.assert_frame_equal(far[columns], near[columns])
    assert sorted(far["document"].unique()) == [0, 1, 2]


async def test_choice_normalisations_and_pmi_on_a_server_are_the_kernels(fused_engine, remote):
    """The analyses' ``choose`` (every lm-evaluation-harness normalisation, PMI after a neutral
    context, even an empty one: the start token alone) and ``choose_many`` run remotely."""
    options = [" red", " blue", " green"]
    for neutral in ("", "Answer:"):
        near = await fused_engine.choose(
            "Red or blue?", options, method="prefill", unconditional=neutral
        )
        far = await remote.choose("Red or blue?", options, unconditional=neutral)
        assert {"prob_per_char", "prob_per_byte", "pmi", "prob_pmi"} <= set(far.columns)
        pd.testing.assert_frame_equal(far, near)
    questions = pd.DataFrame(
        {
            "question": ["Red or blue?", "Is ice cold?"],
            "options": [[" red", " blue"], [" yes", " no"]],
            "answer": [" blue", 0],
        }
    )
    near = await fused_engine.choose_many(
        questions, method="prefill", unconditional="", progress=False
    )
    far = await remote.choose_many(questions, unconditional="", progress=False)
    pd.testing.assert_frame_equal(far, near)
    pd.testing.assert_frame_equal(nbr.choice_accuracy(far), nbr.choice_accuracy(near))


async def test_the_openai_echo_shape_reads_the_same_logprobs(fused_engine, remote):
    """A server without vLLM's prompt_logprobs: OpenAI's echo logprobs give the same numbers,
    with no rank or entropy (the frames leave them empty)."""
    ids = [fused_engine.generator.eos_token_ids[0], *fused_engine.client().family.encode(TEXTS[1])]
    completion = await remote.client().completions.create(
        model=fused_engine.model, prompt=ids, max_tokens=0, echo=True, logprobs=2,
        extra_body={"prompt_logprobs": 2},
    )  # fmt: skip
    choice = completion.choices[0]
    positions = choice.model_extra["prompt_logprobs"]
    rich = [_from_prompt_logprobs(positions[i], ids[i], 2) for i in range(1, len(ids))]
    plain = _from_echo(choice, 1, len(ids), 2)
    assert [e.logprob for e in plain] == [e.logprob for e in rich]
    assert [[t.logprob for t in e.top_logprobs] for e in plain] == [
        [t.logprob for t in e.top_logprobs] for e in rich
    ]
    assert all(e.rank is None and e.entropy is None for e in plain)
    assert all(e.rank is not None for e in rich)


async def test_errors_reach_the_caller(fused_engine, remote):
    with pytest.raises(ValueError, match="chat template"):
        await remote.score(
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]
        )
    wrong = RemoteEngine(remote.base_url, api_key="wrong", document_start=0, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        await wrong.score("Hello")
    await wrong.aclose()
    with pytest.raises(ValueError, match="full distribution"):  # word_starts: the kernel's
        [s async for s in remote.score_many(TEXTS, word_starts=True, progress=False)]
    answer = await fused_engine.score("Hello there")
    with pytest.raises(ValueError, match="in the kernel"):
        await remote.score(answer)
    no_start = RemoteEngine(remote.base_url, api_key=KEY, max_retries=0)
    with pytest.raises(ValueError, match="document_start"):
        await no_start.score("Hello")
    with pytest.raises(ValueError, match="document_start"):  # an empty prompt needs it too
        await no_start.choose("Q?", [" a", " b"], unconditional="")
    assert (await no_start.score("Hello", " there")).output_text == " there"
    await no_start.aclose()
