"""vLLM's sampling extensions on ``responses.create``: ``seed`` and ``logprobs_mode``, validated,
passed to the engine, kept with the response (scripted source, real tokenizer)."""

from __future__ import annotations

import openai
import pytest
from helpers.responses import client_for, ids, stream_events

from nbresponses.frames import logprobs_frame, usage_frame
from nbresponses.tokens.scripted import Script

LOGPROBS = ["message.output_text.logprobs"]


async def test_seed_reaches_the_sampler_and_is_kept_with_the_response(tokenizer):
    client, source = client_for(tokenizer, "ok")
    r = await client.responses.create(input="hi", temperature=0.7, extra_body={"seed": 42})
    assert source.params[-1].seed == 42
    assert r.seed == 42 and r.model_extra == {"seed": 42}
    stored = await client.responses.retrieve(r.id)
    assert stored.seed == 42 and stored == r
    assert client.store.get(r.id).request["seed"] == 42  # the stored create parameters
    assert '"seed":42' in r.to_json(indent=None)
    frame = usage_frame([r, stored])
    assert frame["seed"].tolist() == [42, 42] and str(frame["seed"].dtype) == "Int64"
    assert frame["temperature"].tolist() == [0.7, 0.7]


async def test_no_seed_no_field(tokenizer):
    client, source = client_for(tokenizer, "ok")
    r = await client.responses.create(input="hi")
    assert source.params[-1].seed is None and r.model_extra == {}
    assert usage_frame(r)["seed"].isna().all()


@pytest.mark.parametrize("seed", [0, -1, -(2**63), 2**63 - 1])
async def test_every_int64_seed_is_accepted(tokenizer, seed):
    client, source = client_for(tokenizer, "ok")
    r = await client.responses.create(input="hi", extra_body={"seed": seed})
    assert source.params[-1].seed == seed and r.seed == seed
    assert usage_frame(r)["seed"].iloc[0] == seed  # exact, beyond float64's 2**53


async def test_seed_streamed_is_on_every_snapshot(tokenizer):
    client, _ = client_for(tokenizer, "ok")
    events = await stream_events(client, input="hi", extra_body={"seed": 5})
    assert events[0].response.seed == 5 and events[-1].response.seed == 5


@pytest.mark.parametrize(
    ("value", "code"),
    [
        (1.5, None),
        (True, None),
        ("3", None),
        (2**63, "integer_out_of_range"),
        (-(2**63) - 1, "integer_out_of_range"),
    ],
)
async def test_bad_seed_is_a_400_naming_it(tokenizer, value, code):
    client, source = client_for(tokenizer, "x")
    with pytest.raises(openai.BadRequestError) as err:
        await client.responses.create(input="hi", extra_body={"seed": value})
    assert err.value.param == "seed" and err.value.code == code
    assert err.value.status_code == 400 and source.prompts == []


async def test_seed_as_a_keyword_too(tokenizer):
    """The SDK's ``create`` has no ``seed``; a caller of our client may still pass it as a
    keyword (as extra_body keys are merged into the same parameters)."""
    client, source = client_for(tokenizer, "x")
    await client.responses.create(input="hi", seed=3)
    assert source.params[-1].seed == 3


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"logprobs_mode": "raw_logits"}, "it must be 'raw_logprobs' or 'processed_logprobs'"),
        ({"logprobs_mode": "processed_logits"}, "logits are not reported"),
        ({"logprobs_mode": 1}, "it must be"),
    ],
)
async def test_bad_logprobs_mode(tokenizer, extra, message):
    client, _ = client_for(tokenizer, "x")
    with pytest.raises(openai.BadRequestError) as err:
        await client.responses.create(input="hi", include=LOGPROBS, extra_body=extra)
    assert err.value.param == "logprobs_mode" and message in err.value.message


async def test_processed_logprobs_need_logprobs(tokenizer):
    client, _ = client_for(tokenizer, "x")
    with pytest.raises(openai.BadRequestError) as err:
        await client.responses.create(
            input="hi", extra_body={"logprobs_mode": "processed_logprobs"}
        )
    assert err.value.param == "logprobs_mode" and "include" in err.value.message


async def test_processed_logprobs_ride_beside_the_raw_ones(tokenizer):
    """The engine's processed logprob reaches every logprob entry of the Response, the stream
    deltas and the frame's ``processed_logprob`` column; the raw ``logprob`` is untouched."""
    text = "Paris it is."
    n = len(tokenizer.encode(text))
    script = Script(
        ids(tokenizer, text),
        logprobs=[-0.5 - i for i in range(n + 1)],
        processed_logprobs=[-0.25 - i for i in range(n + 1)],
    )
    client, source = client_for(tokenizer, script)
    extra = {"logprobs_mode": "processed_logprobs"}
    events = await stream_events(
        client, input="hi", include=LOGPROBS, top_logprobs=2, extra_body=extra
    )
    assert source.params[-1].processed_logprobs
    response = events[-1].response
    assert response.logprobs_mode == "processed_logprobs"
    entries = response.output[0].content[0].logprobs
    assert [e.logprob for e in entries] == [-0.5 - i for i in range(n)]
    assert [e.processed_logprob for e in entries] == [-0.25 - i for i in range(n)]
    deltas = [lp for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    assert [d.processed_logprob for d in deltas] == [-0.25 - i for i in range(n)]
    frame = logprobs_frame(response)
    assert frame["processed_logprob"].tolist() == [-0.25 - i for i in range(n)]
    assert frame["logprob"].tolist() == [-0.5 - i for i in range(n)]
    assert frame.equals(logprobs_frame(events))  # the stream gives the same frame


async def test_raw_mode_has_no_processed_column_values(tokenizer):
    client, source = client_for(tokenizer, "Paris.")
    r = await client.responses.create(input="hi", include=LOGPROBS)
    assert not source.params[-1].processed_logprobs
    entry = r.output[0].content[0].logprobs[0]
    assert entry.model_extra == {}
    assert logprobs_frame(r)["processed_logprob"].isna().all()


async def test_seed_and_processed_logprobs_come_back_after_a_restart(tokenizer, tmp_path):
    """Kept in the SQLite store: a restarted kernel retrieves the seed, the processed logprobs
    and the stored create parameters."""
    path = tmp_path / "responses.sqlite3"
    script = Script(ids(tokenizer, "Paris."), processed_logprobs=[-0.125] * 4)
    client, _ = client_for(tokenizer, script, store_path=path)
    made = await client.responses.create(
        input="hi",
        include=LOGPROBS,
        extra_body={"seed": 2**63 - 1, "logprobs_mode": "processed_logprobs"},
    )
    assert client.flush()
    client.close()
    restarted, _ = client_for(tokenizer, "unused", store_path=path)
    try:
        again = await restarted.responses.retrieve(made.id)
        assert again == made and again.seed == 2**63 - 1
        assert again.output[0].content[0].logprobs[0].processed_logprob == -0.125
        assert restarted.store.get(made.id).request["seed"] == 2**63 - 1
        assert usage_frame(again)["seed"].iloc[0] == 2**63 - 1
    finally:
        restarted.close()
