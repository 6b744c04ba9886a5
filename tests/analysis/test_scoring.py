"""Logprobs of given text: scorings reproduce generations, agree across methods, window long
texts, and read as Responses in every frame."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from helpers.engine import PROMPTS, chat_ids, score_at_once, scored_numbers, steps_of
from helpers.server import eventually

import nbresponses as nbr
from nbresponses.analysis.local import LocalBackend
from nbresponses.engine import Engine
from nbresponses.runtime.generator import TokenGenerator
from nbresponses.service.scoring import DEFAULT_METHOD, Scorer, Scoring, windows
from nbresponses.tokens.contract import SamplingParams
from nbresponses.tokens.scripted import ScriptedTokenSource

LOGPROBS = {"include": ["message.output_text.logprobs"], "top_logprobs": 3}


@pytest.fixture
async def engine(tiny_fused, tokenizer):
    """``tiny_fused`` on the tests' SQLite store: another engine reads its responses."""
    eng = Engine(TokenGenerator(tiny_fused, tokenizer=tokenizer))
    yield eng
    await eng.aclose()


def _entries(response):
    part = response.output[0].content[0]
    return [
        (lp.token, lp.logprob, [(t.token, t.logprob) for t in lp.top_logprobs])
        for lp in part.logprobs
    ]


async def test_forcing_a_generation_reproduces_its_logprobs_bit_for_bit(engine, tokenizer):
    prompt = chat_ids(tokenizer, PROMPTS[0])
    params = SamplingParams(max_tokens=16, temperature=0, logprobs=True, top_logprobs=3)
    steps = [s async for s in engine.generator.generate(prompt, params)]
    generated = [t for s in steps for t in s.token_ids if t not in engine.generator.eos_token_ids]
    streamed = [lp for s in steps for lp in s.logprobs][: len(generated)]
    scorer = Scorer(engine.generator, engine.client().family, model=engine.model)
    scoring = await scorer.score_tokens(Scoring(prompt, generated), top_logprobs=3, method="decode")
    got = scoring.output[0].content[0].logprobs
    assert [lp.logprob for lp in got] == [lp.logprob for lp in streamed]
    assert [[t.logprob for t in lp.top_logprobs] for lp in got] == [
        [v for _, v in lp.top] for lp in streamed
    ]
    # the extra details: the exact rank (1 for greedy tokens) and the entropy
    assert all(lp.rank == 1 and lp.entropy > 0 for lp in got)


async def test_scoring_an_answer_through_the_api_equals_its_stream(engine):
    answer = await engine.client().responses.create(
        input="Say hello.", temperature=0, max_output_tokens=10, **LOGPROBS
    )
    scored = await engine.score(
        "Say hello.", answer.output_text, chat=True, top_logprobs=3, method="decode"
    )
    got, want = nbr.logprobs_frame(scored), nbr.logprobs_frame(answer)
    if list(got.token.astype(str)) == list(want.token.astype(str)):  # the text re-tokenizes alike
        assert list(got.logprob) == list(want.logprob)
    assert got.given.all() and not want.given.any()
    assert got.entropy.notna().all() and want.entropy.isna().all()
    assert scored.metadata["nbresponses.method"] == "decode"


async def test_prefill_and_decode_agree_on_fp32_and_are_each_repeatable(engine):
    text = "The sea was calm. " * 12
    decode = await engine.score(text, top_logprobs=2, method="decode")
    prefill = await engine.score(text, top_logprobs=2, method="prefill")
    again = await engine.score(text, top_logprobs=2, method="prefill")
    a, b = nbr.logprobs_frame(decode), nbr.logprobs_frame(prefill)
    assert list(a.token.astype(str)) == list(b.token.astype(str))
    # fp32 rounding only (this tiny model's logits are large: relative 1e-5)
    np.testing.assert_allclose(a.logprob, b.logprob, rtol=1e-5, atol=1e-5)
    assert _entries(prefill) == _entries(again)
    diff = nbr.compare_scorings(decode, prefill, names=("decode", "prefill"))
    relative = diff["dlogprob"].abs() / diff["logprob_decode"].abs().clip(lower=1)
    assert len(diff) == len(a) and relative.max() < 1e-5
    assert diff["argmax_agree"].mean() > 0.9 and (diff["topk_kl"].dropna() < 1e-3).all()


async def test_long_text_is_scored_in_windows(engine):
    scorer = Scorer(engine.generator, engine.client().family, model=engine.model)
    context = engine.generator.context_length
    tokens = [int(t) for t in np.random.default_rng(0).integers(100, 4000, size=context + 300)]
    job = Scoring([int(engine.generator.eos_token_ids[0])], tokens)
    parts = list(windows(job, context))
    assert sum(len(g) for _, g in parts) == len(tokens)
    assert all(len(p) + len(g) < context for p, g in parts)
    assert all(len(p) == (context - 1) // 2 for p, _ in parts[1:])  # half a context before
    scoring = await scorer.score_tokens(job, method="prefill")
    assert len(scoring.output[0].content[0].logprobs) == len(tokens)
    # a later window's tokens score as that window alone does
    prompt, given = parts[1]
    alone = await scorer.score_tokens(Scoring(prompt, given), method="prefill")
    first = len(parts[0][1])
    assert [lp.logprob for lp in scoring.output[0].content[0].logprobs[first:][: len(given)]] == [
        lp.logprob for lp in alone.output[0].content[0].logprobs
    ]


async def test_choose_ranks_options_and_shares_the_prompt(engine):
    frame = await engine.choose("Pick a colour: red or blue?", ["red", "blue", "green"], chat=True)
    assert list(frame.index) == ["red", "blue", "green"]
    assert frame["prob"].sum() == pytest.approx(1.0) and frame["prob_mean"].sum() == pytest.approx(
        1
    )
    assert (frame["tokens"] >= 1).all()
    best = frame["logprob"].idxmax()
    assert frame.loc[best, "prob"] == frame["prob"].max()


async def test_score_many_keeps_order_and_stops_cleanly(engine):
    texts = ["one two three", "four five", ("Question: 2+2=", " 4"), "six"]
    scorings = [s async for s in engine.score_many(texts, progress=False, concurrency=2)]
    alone = [
        await engine.score(*t) if isinstance(t, tuple) else await engine.score(t) for t in texts
    ]
    assert [_entries(s) for s in scorings] == [_entries(s) for s in alone]
    frame = nbr.logprobs_frame(scorings)
    assert frame.response_id.nunique() == len(texts) and frame.given.all()
    documents = await engine.score_frame(texts, progress=False)
    assert (
        documents.document.tolist() == sorted(documents.document) and documents.document.max() == 3
    )
    assert documents.logprob.tolist() == frame.logprob.tolist()
    stream = engine.score_many(["a b c d e f g"] * 20, progress=False, concurrency=4)
    async for _ in stream:
        break
    await stream.aclose()  # the unread ones are cancelled, nothing hangs
    await eventually(lambda: engine.generator.running == 0 and engine.generator.waiting == 0)


async def test_short_texts_at_once_share_runs_with_the_numbers_each_gets_alone(
    engine, tokenizer, monkeypatch
):
    generator = engine.generator
    documents = [tokenizer.encode(f"{w} is the word of the day, {w}.") for w in (
        "Sun", "Moon", "Rain", "A long winding river", "Snow", "Wind", "Stone", "Leaf"
    )]  # fmt: skip
    rows: list[int] = []
    run_steps = generator.runner.run_steps

    def counted(ids, positions, past, keep=0):
        rows.append(ids.shape[0])
        return run_steps(ids, positions, past, keep)

    monkeypatch.setattr(generator.runner, "run_steps", counted)
    generator.prefix_cache.clear()
    together = await score_at_once(generator, documents)
    assert rows and max(rows) > 1 and sum(rows) == len(documents)  # rows of shared runs
    generator.prefix_cache.clear()
    # one at a time: each job alone in its round, in runs of its own
    alone = [await steps_of(generator.score(ids, top_logprobs=3)) for ids in documents]
    assert sum(rows) == len(documents)  # a job alone ran no multi-row step
    assert [scored_numbers(s) for s in together] == [scored_numbers(s) for s in alone]
    assert [s[-1].finish_reason for s in together] == ["length"] * len(documents)


async def test_options_after_one_question_reuse_it_rather_than_compute_it_again(engine, tokenizer):
    generator = engine.generator
    question = tokenizer.encode("Which of these is a colour that the sky can have at noon? Answer:")
    options = [question + tokenizer.encode(o) for o in (" red", " blue", " grey", " green")]
    start = len(question)  # the options' tokens are scored, after the question
    generator.prefix_cache.clear()
    scored = await score_at_once(generator, options, start=start)
    cached = [steps[-1].stats.cached_tokens for steps in scored]
    # the first computes the question; the others wait for it and take it from the cache
    assert cached[0] == 0 and all(c >= start - 1 for c in cached[1:])
    generator.prefix_cache.clear()
    alone = [await steps_of(generator.score(ids, start=start, top_logprobs=3)) for ids in options]
    assert [scored_numbers(s) for s in scored] == [scored_numbers(s) for s in alone]


async def test_a_shared_run_that_fails_leaves_each_job_to_run_alone(engine, tokenizer, monkeypatch):
    generator = engine.generator
    documents = [tokenizer.encode(t) for t in ("one two three", "four five six", "seven eight")]
    generator.prefix_cache.clear()
    want = [await steps_of(generator.score(ids, top_logprobs=3)) for ids in documents]

    tried: list[int] = []

    def broken(ids, positions, past, keep=0):
        tried.append(ids.shape[0])
        raise RuntimeError("a run of several rows failed")

    monkeypatch.setattr(generator.runner, "run_steps", broken)
    generator.prefix_cache.clear()
    got = await score_at_once(generator, documents)
    assert tried == [3]  # the three were tried as the rows of one run
    assert [scored_numbers(s) for s in got] == [scored_numbers(s) for s in want]
    assert [s[-1].finish_reason for s in got] == ["length"] * 3


async def test_bad_requests_say_what_to_do(engine, tokenizer):
    with pytest.raises(ValueError, match="method"):
        await engine.score("x", method="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="chat=True"):
        await engine.score([{"role": "user", "content": "hi"}], chat=False)
    with pytest.raises(ValueError, match="assistant turn"):
        await engine.score([{"role": "user", "content": "hi"}])
    scripted = LocalBackend(ScriptedTokenSource([[1]]), engine.client().family, model="m")
    with pytest.raises(ValueError, match="method='decode'"):
        await scripted.score_text("some text")  # the default, prefill, needs a ScoringSource
    assert DEFAULT_METHOD == "prefill"
    with pytest.raises(ValueError, match="forced tokens"):
        SamplingParams(max_tokens=3, forced_tokens=(1, 2))
        from nbresponses.runtime import sampling

        sampling.validate(SamplingParams(max_tokens=3, forced_tokens=(1, 2)))


def test_option_likelihoods_maths() -> None:
    from helpers.frames import logprob, message, response

    scorings = [
        response(message([[logprob("a", math.log(0.5)), logprob("b", math.log(0.5))], None])),
        response(message([[logprob("c", math.log(0.2))], None])),
    ]
    frame = nbr.option_likelihoods(scorings, ["ab", "c"])
    assert frame.loc["ab", "logprob"] == pytest.approx(math.log(0.25))
    assert frame.loc["c", "mean_logprob"] == pytest.approx(math.log(0.2))
    assert frame.loc["ab", "prob"] == pytest.approx(0.25 / 0.45)
    assert isinstance(frame, pd.DataFrame)


# byte-level BPE spells these leading bytes so: space, \n, \t, \r, \x0b, \x0c
_BPE_WHITESPACE = "ĠĊĉčċČ"


@pytest.mark.parametrize("method", ["decode", "prefill"])
async def test_word_start_masses_and_bow_correction_match_pytorch(
    engine, tiny_source, tokenizer, method
):
    import torch
    from transformers import AutoModelForCausalLM

    text = "The old man the boat.\nThe horse raced past the barn fell."
    plain = await engine.score(text, method=method)
    scored = await engine.score(text, method=method, word_starts=True)
    # the option adds numbers and changes none: the same logprobs, bit for bit
    assert _entries(scored) == _entries(plain)
    entries = scored.output[0].content[0].logprobs
    got = np.array([e.word_start_logmass for e in entries] + [entries[-1].word_start_logmass_after])

    eos = int(engine.generator.eos_token_ids[0])
    ids = [eos, *tokenizer.encode(text, add_special_tokens=False), eos]
    model = AutoModelForCausalLM.from_pretrained(str(tiny_source)).eval()
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
    names = tokenizer.convert_ids_to_tokens(list(range(logp.shape[-1])))
    bow = torch.tensor([bool(t) and t[0] in _BPE_WHITESPACE for t in names])
    bow[eos] = True
    want = torch.logsumexp(logp[:, bow], -1).numpy()[: len(ids) - 1]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)

    words = nbr.words_frame(scored, bow_correction=True)
    raw = nbr.words_frame(scored)
    frame = nbr.logprobs_frame(scored)
    for w in range(len(words)):
        first, last = int(raw.first_position[w]), int(raw.last_position[w])
        leading = frame.text[first][:1].isspace()
        term = want[last + 1] - (want[first] if leading else 0.0)
        assert words.logprob[w] == pytest.approx(raw.logprob[w] + term, abs=1e-4)
    assert words.text.tolist() == text.split()


async def test_choose_normalisations_and_pmi_match_pytorch(engine, tiny_source, tokenizer):
    import torch
    from transformers import AutoModelForCausalLM

    prompt, options = "The capital of France is", [" Paris", " a city in Europe", " Lyon"]
    frame = await engine.choose(prompt, options, unconditional="")
    model = AutoModelForCausalLM.from_pretrained(str(tiny_source)).eval()
    eos = int(engine.generator.eos_token_ids[0])

    def summed(context: list[int], option: str) -> float:
        given = tokenizer.encode(option, add_special_tokens=False)
        ids = torch.tensor([[*context, *given]])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0].double(), -1)
        rows = torch.arange(len(context) - 1, len(context) + len(given) - 1)
        return float(logp[rows, torch.tensor(given)].sum())

    context = tokenizer.encode(prompt, add_special_tokens=False)
    want = np.array([summed(context, o) for o in options])
    alone = np.array([summed([eos], o) for o in options])  # lm-eval: empty context = EOT
    np.testing.assert_allclose(frame["logprob"], want, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(frame["logprob_unconditional"], alone, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(frame["pmi"], want - alone, rtol=1e-5, atol=2e-4)
    np.testing.assert_allclose(
        frame["logprob_per_char"], want / [len(o) for o in options], atol=1e-4
    )


async def test_choose_many_equals_choose_per_question(engine):
    questions = pd.DataFrame(
        {
            "question": ["Red or blue?", "Is ice cold?", "2+2="],
            "options": [[" red", " blue"], [" yes", " no", " maybe"], [" 4", " 5"]],
            "answer": [" blue", 0, None],
        },
        index=pd.Index(["colour", "ice", "sum"], name="id"),
    )
    frame = await engine.choose_many(questions, unconditional="Answer:", progress=False)
    assert frame.index.names == ["id", "option_index"] and len(frame) == 7
    for key, row in questions.iterrows():
        alone = await engine.choose(row.question, row.options, unconditional="Answer:")
        got = frame.loc[key].set_index("option")
        pd.testing.assert_frame_equal(got.drop(columns="correct"), alone)
    acc = nbr.choice_accuracy(frame)
    assert acc.index.tolist() == ["colour", "ice", "sum"]
    assert {"correct_sum", "correct_per_char", "correct_per_byte", "correct_pmi"} <= set(acc)
    assert pd.isna(acc.loc["sum", "correct_sum"]) and acc.loc["ice", "answer"] == " yes"
    with pytest.raises(ValueError, match="no column"):
        await engine.choose_many(questions.drop(columns="options"), progress=False)
    # options as numpy arrays (a parquet file's or a dataset's list column) are lists too
    arrays = questions.assign(options=[np.array(o) for o in questions.options])
    same = await engine.choose_many(arrays, unconditional="Answer:", progress=False)
    pd.testing.assert_frame_equal(same, frame)
    with pytest.raises(ValueError, match="question 'ice' is empty"):
        await engine.choose_many(questions.assign(options=[[" a"], [], [" b"]]), progress=False)
    with pytest.raises(ValueError, match="must be a list of strings, got str"):
        await engine.choose("Red or blue?", " red")
    with pytest.raises(ValueError, match="must be strings"):
        await engine.choose("2+2=", [4, 5])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
async def test_scoring_a_response_reproduces_its_stream_bit_for_bit(engine, temperature):
    answer = await engine.client().responses.create(
        input="Tell me about the sea.",
        temperature=temperature,
        max_output_tokens=24,
        **LOGPROBS,
    )
    scored = await engine.score(answer)
    got, want = nbr.logprobs_frame(scored), nbr.logprobs_frame(answer)
    assert len(got) == len(want) and list(got.bytes) == list(want.bytes)
    assert got.logprob.tolist() == want.logprob.tolist()  # ==: the streamed floats
    assert _entries(scored) == _entries(answer)  # the top 3 alternatives too
    assert got["rank"].notna().all() and got["entropy"].notna().all()
    again = await engine.score(answer, input="Tell me about the sea.")  # the prompt given
    assert _entries(again) == _entries(answer)
    both = await engine.score([answer, answer])
    assert [_entries(s) for s in both] == [_entries(answer)] * 2
    diff = nbr.compare_scorings(answer, scored)
    assert (diff.dlogprob == 0).all() and len(diff) == len(want)
    # the text re-encoded: maybe other tokens; compare then refuses instead of mis-joining
    text = await engine.score("Tell me about the sea.", answer.output_text, chat=True)
    if list(nbr.logprobs_frame(text).bytes) != list(want.bytes):
        with pytest.raises(ValueError, match=r"differ at token \d+.*engine.score\(response\)"):
            nbr.compare_scorings(answer, text)


async def test_scoring_a_response_says_what_it_needs(engine):
    bare = await engine.client().responses.create(input="Hi", max_output_tokens=4)
    with pytest.raises(ValueError, match="logprobs"):
        await engine.score(bare)
    unstored = await engine.client().responses.create(
        input="Hi", max_output_tokens=4, store=False, **LOGPROBS
    )
    with pytest.raises(ValueError, match="not in this engine's store"):
        await engine.score(unstored)
    with pytest.raises(ValueError, match="rebuilt prompt has"):
        await engine.score(unstored, input="Hello there, a longer question than before")
    with pytest.raises(ValueError, match="no continuation"):
        await engine.score(unstored, "x")


@pytest.fixture(scope="module")
def tiny_fused_q4(tiny_source, cache_dir):
    from nbresponses.models.prepare import prepare_model

    return prepare_model(tiny_source, "fused-q4", cache_dir=cache_dir, progress=False)


async def test_full_vocabulary_comparison_matches_torch_kl_div(
    engine, tiny_fused_q4, tiny_source, tokenizer
):
    import torch
    from transformers import AutoModelForCausalLM

    other = Engine(TokenGenerator(tiny_fused_q4, tokenizer=tokenizer), store_path="off")
    try:
        texts = ["The sea was calm and the boat was slow.", "One two three four five six."]
        frame = await engine.divergence(other, texts, names=("fp32", "q4"), chunk=5, progress=False)
        # b's own distributions, from its engine; a's reference from PyTorch fp32
        eos = int(engine.generator.eos_token_ids[0])
        model = AutoModelForCausalLM.from_pretrained(str(tiny_source)).eval()
        for document, text in enumerate(texts):
            ids = [eos, *tokenizer.encode(text, add_special_tokens=False)]
            steps = other.generator.score(ids, start=1, distribution=True)
            q = np.stack([lp.distribution for s in [s async for s in steps] for lp in s.logprobs])
            with torch.no_grad():
                p = torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1].double(), -1)
            want = torch.nn.functional.kl_div(
                torch.from_numpy(q).double(), p, log_target=True, reduction="none"
            ).sum(-1)
            rows = frame[frame.document == document]
            assert rows.position.tolist() == list(range(len(ids) - 1))
            np.testing.assert_allclose(rows.kl, want.numpy(), rtol=1e-3, atol=1e-5)
            assert (rows.kl > 0).any()
            # the chunked comparison scores exactly what a plain prefill scoring does
            alone = nbr.logprobs_frame(await engine.score(text, method="prefill"))
            assert rows.logprob_fp32.tolist() == alone.logprob.tolist()
            assert rows.rank_fp32.tolist() == alone["rank"].tolist()
            q4 = nbr.logprobs_frame(await other.score(text, method="prefill"))
            assert rows.logprob_q4.tolist() == q4.logprob.tolist()
            np.testing.assert_allclose(rows.dp, np.exp(q4.logprob) - np.exp(alone.logprob))
        summary = nbr.divergence_summary(frame, names=("fp32", "q4"))
        assert summary["n"] == len(frame) and summary["kld_mean"] == pytest.approx(frame.kl.mean())
        same = await engine.divergence(engine, texts[:1], progress=False)
        assert (same.kl == 0).all() and same.argmax_agree.all()
    finally:
        await other.aclose()


async def test_a_response_rescored_on_another_recipe_lines_up(engine, tiny_fused_q4, tokenizer):
    other = Engine(TokenGenerator(tiny_fused_q4, tokenizer=tokenizer))  # the same database file
    try:
        question = "Name three colours."
        answer = await engine.client().responses.create(
            input=question, temperature=0, max_output_tokens=16, **LOGPROBS
        )
        assert engine.client().flush()
        from_store = await other.score(answer)  # the conversation read from the shared store
        given = await other.score(answer, input=question)
        assert _entries(from_store) == _entries(given)
        rows = nbr.compare_scorings(answer, from_store, names=("fp32", "q4"))
        assert list(rows.token) == list(nbr.logprobs_frame(answer).token.astype(str))
        assert from_store.model == other.model and (rows.dlogprob != 0).any()
    finally:
        await other.aclose()


async def test_scoring_a_later_turn_rebuilds_its_conversation(engine):
    client = engine.client()
    first = await client.responses.create(
        input="Name a fruit.", instructions="Answer briefly.", max_output_tokens=8, **LOGPROBS
    )
    second = await client.responses.create(
        input="And a vegetable?",
        instructions="Answer briefly.",
        previous_response_id=first.id,
        temperature=0,
        max_output_tokens=8,
        **LOGPROBS,
    )
    scored = await engine.score(second)
    assert _entries(scored) == _entries(second)
    assert scored.usage.input_tokens == second.usage.input_tokens
