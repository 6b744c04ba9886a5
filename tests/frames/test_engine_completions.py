"""Frames of the engine's own Completions answers (the tiny model): an echoed prompt, vLLM's
``prompt_logprobs`` and the stream read as the engine's scoring and the plain answer read."""

from __future__ import annotations

import pytest
from pandas.testing import assert_frame_equal

import nbresponses as nbr
from nbresponses.engine import Engine

pytestmark = pytest.mark.timeout(120)
TEXT = "The sea was calm and the sky was grey."
KEYS = ["response_id", "item_id", "position", "char_offset", "byte_offset"]
CATEGORIES = dict.fromkeys(["token", "runner_up"], object)


def rows(frame):
    """The columns that say what was generated (not where in the answer or which object)."""
    return frame.drop(columns=KEYS).reset_index(drop=True).astype(CATEGORIES)


def document(engine: Engine, text: str) -> list[int]:
    return [engine.generator.eos_token_ids[0], *engine.client().family.encode(text)]


async def test_echo_prompt_then_the_answer_as_without_echo(fused_engine) -> None:
    ids = document(fused_engine, TEXT)
    client = fused_engine.openai()
    kwargs = dict(model=fused_engine.model, prompt=ids, max_tokens=6, temperature=0, logprobs=2,
                  extra_body={"ignore_eos": True})  # fmt: skip
    plain = await client.completions.create(**kwargs)
    echoed = await client.completions.create(**kwargs, echo=True)
    frame = nbr.logprobs_frame(echoed.model_dump(mode="json"))
    assert list(frame.given) == [True] * len(ids) + [False] * 6
    assert frame.logprob.isna().tolist() == [True] + [False] * (len(ids) + 5)
    assert "".join(frame.text) == echoed.choices[0].text
    assert_frame_equal(rows(frame[~frame.given]), rows(nbr.logprobs_frame(plain)))
    top_plain = nbr.top_logprobs_frame(plain)
    assert top_plain.groupby("position").size().eq(2).all()  # the chosen extra is trimmed
    # the stream gives the rows of the whole answer
    chunks = [c async for c in await client.completions.create(**kwargs, stream=True)]
    assert_frame_equal(rows(nbr.logprobs_frame(chunks)), rows(nbr.logprobs_frame(plain)))
    usage = nbr.usage_frame(chunks)
    assert usage.loc[0, "status"] == "incomplete" and bool(usage.loc[0, "streamed"])


async def test_prompt_logprobs_read_as_the_engines_scoring(fused_engine) -> None:
    ids = document(fused_engine, TEXT)
    scoring = await fused_engine.score(TEXT, top_logprobs=3, method="prefill")
    completion = await fused_engine.openai().completions.create(
        model=fused_engine.model, prompt=ids, max_tokens=0, echo=True,
        extra_body={"prompt_logprobs": 3},
    )  # fmt: skip
    frame = nbr.logprobs_frame(completion)
    expected = nbr.logprobs_frame(scoring)
    columns = ["token", "logprob", "rank", "entropy", "given", "text", "n_top", "runner_up"]
    assert_frame_equal(frame[columns].astype(CATEGORIES), expected[columns].astype(CATEGORIES))
    top = nbr.top_logprobs_frame(completion)
    want = nbr.top_logprobs_frame(scoring)
    assert_frame_equal(
        top[["position", "rank", "logprob", "chosen"]],
        want[["position", "rank", "logprob", "chosen"]],
    )
