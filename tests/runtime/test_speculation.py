"""Exact self-speculation: drafted tokens change the speed, never a token or a logprob."""

from __future__ import annotations

import asyncio
from typing import ClassVar

import pytest
from helpers.engine import PROMPTS, chat_ids

from nbresponses.runtime.generator import TokenGenerator
from nbresponses.runtime.speculation import (
    EVERY_COLUMN,
    MAX_DRAFT,
    OWN_COLUMNS,
    Drafter,
    expected_kept,
    step_width,
)
from nbresponses.tokens.contract import SamplingParams


def test_the_draft_is_what_followed_the_longest_earlier_match() -> None:
    drafter = Drafter([1, 2, 3, 4, 5, 6, 1, 2])
    assert drafter.propose(limit=10) == [3, 4, 5, 6, 1, 2]  # "1 2" before: what followed it
    drafter.extend([3])
    assert drafter.propose(limit=10) == [4, 5, 6, 1, 2, 3]  # "1 2 3" before
    assert drafter.propose(limit=2) == [4, 5]
    drafter.extend([3, 9])
    assert drafter.propose(limit=10) == []  # "3 9" never occurred before
    assert Drafter(list(range(20)) * 2).propose(limit=100) == list(range(MAX_DRAFT))


def test_acceptance_learns_from_kept_and_rejected_drafts() -> None:
    drafter = Drafter([1, 2, 3])
    assert drafter.acceptance == pytest.approx(0.9)  # nothing seen yet: worth a try
    for _ in range(10):
        drafter.record(8, 8)  # every token kept: no rejection observed
    assert drafter.acceptance > 0.95
    for _ in range(10):
        drafter.record(8, 0)  # the first token rejected, again and again
    assert drafter.acceptance < 0.3
    with pytest.raises(ValueError, match="kept 3 of 2"):
        drafter.record(2, 3)


@pytest.mark.parametrize("cost", [EVERY_COLUMN, OWN_COLUMNS])
def test_the_step_width_pays_for_the_tokens_it_feeds(cost) -> None:
    assert expected_kept(0.5, 3) == 0.5 + 0.25 + 0.125
    assert step_width([], rows=16, cost=cost) == 1
    # a row that quotes its input drafts all it has, alone or with 15 mates quoting too
    assert step_width([(8, 0.99)], rows=1, cost=cost) == 9
    assert step_width([(8, 0.99)] * 16, rows=16, cost=cost) == 9
    # one quoting row among 15 that draft nothing would make 16 rows wider for one row's sake
    assert step_width([(8, 0.99)], rows=16, cost=cost) == 1
    # drafts mostly wrong: not worth even a token
    assert step_width([(4, 0.05)], rows=1, cost=cost) == 1
    assert step_width([(4, 0.05)] * 16, rows=16, cost=cost) == 1
    # a short draft bounds the width; a middling acceptance stops it early
    assert step_width([(2, 0.99)], rows=1, cost=cost) == 3
    assert 1 < step_width([(8, 0.6)] * 4, rows=4, cost=cost) < 9


def test_sixteen_rows_widen_only_where_a_row_costs_more_than_its_tokens() -> None:
    """16 rows whose drafts are kept 60% of the time: where the attention reads every column
    of a row's buffers, a plain step's fixed cost is large enough that verifying one draft a row
    pays; where it reads the row's own columns (our KVAttention: a 16 x 2 step costs 1.67x a
    plain one, benchmarks/speculation.py), it does not."""
    drafts = [(4, 0.6)] * 16
    assert step_width(drafts, rows=16, cost=EVERY_COLUMN) == 2
    assert step_width(drafts, rows=16, cost=OWN_COLUMNS) == 1


async def test_the_step_cost_is_the_graphs(tiny_fused, bundled_model, tokenizer) -> None:
    """Standard-operator attention (the tiny fused graph) reads every column; the default
    recipe's KVAttention a row's own."""
    async with TokenGenerator(tiny_fused, tokenizer=tokenizer) as engine:
        assert engine._scheduler.step_cost == EVERY_COLUMN
    async with TokenGenerator(bundled_model) as engine:
        assert engine._scheduler.step_cost == OWN_COLUMNS


async def _steps(engine, prompt, params):
    steps = [step async for step in engine.generate(prompt, params)]
    return steps, steps[-1].stats


class _Oracle(Drafter):
    """Drafts from the answer plain decoding gives (the random tiny model repeats nothing an
    n-gram would find), with every third draft wrong from its second token on: kept drafts,
    rejected drafts and the corrected token all get exercised."""

    answers: ClassVar[dict[tuple[int, ...], list[int]]] = {}

    def __init__(self, prompt) -> None:
        super().__init__(prompt)
        self.answer = self.answers[tuple(prompt)]
        self.prompt_length = len(prompt)
        self.calls = 0

    def propose(self, limit: int) -> list[int]:
        self.calls += 1
        done = len(self.tokens) - self.prompt_length
        draft = self.answer[done : done + min(limit, 5)]
        if self.calls % 3 == 0 and len(draft) > 1:
            draft[1:] = [(t + 1) % 1000 for t in draft[1:]]
        return draft


async def test_speculation_is_on_where_steps_are_exact_and_only_there(
    tiny_fused, tiny_model, tokenizer
) -> None:
    async with TokenGenerator(tiny_fused, tokenizer=tokenizer) as engine:
        assert engine.speculation
        engine.speculation = False
        assert not engine.speculation
    async with TokenGenerator(tiny_model, tokenizer=tokenizer) as engine:  # the Optimum graph
        assert not engine.speculation
        with pytest.raises(ValueError, match="no exact multi-token steps"):
            engine.speculation = True
        engine.speculation = False  # off stays possible


async def test_speculation_gives_plain_decoding_bits(tiny_fused, tokenizer, monkeypatch) -> None:
    """Greedy, with logprobs and alternatives: alone without drafts, alone with them, and
    batched with them (three rows, each verifying its own draft in a shared step) give equal
    steps, in fewer model runs with drafts."""
    from nbresponses.runtime import scheduler

    params = SamplingParams(max_tokens=64, temperature=0, logprobs=True, top_logprobs=3)
    prompts = [chat_ids(tokenizer, text) for text in PROMPTS[:3]]
    async with TokenGenerator(tiny_fused, tokenizer=tokenizer, prefix_cache_bytes=0) as engine:
        assert engine.runner.exact_steps
        assert engine.runner.reads_every_column  # the standard operators' attention
        engine.speculation = False
        plain = [(await _steps(engine, p, params))[0] for p in prompts]
        _Oracle.answers = {
            tuple(p): [t for s in steps for t in s.token_ids]
            for p, steps in zip(prompts, plain, strict=True)
        }
        monkeypatch.setattr(scheduler, "Drafter", _Oracle)
        engine.speculation = True
        runs = engine.decode_steps
        drafted = [await _steps(engine, p, params) for p in prompts]
        runs = engine.decode_steps - runs
        runs_batched = engine.decode_steps
        batched = await asyncio.gather(*(_steps(engine, p, params) for p in prompts))
        runs_batched = engine.decode_steps - runs_batched
    assert runs_batched < 63  # three rows, 63 decoded tokens each: drafts verified batched
    assert all(stats.accepted_draft_tokens > 0 for _, stats in batched)
    kept = sum(stats.accepted_draft_tokens for _, stats in drafted)
    drafts = sum(stats.draft_tokens for _, stats in drafted)
    assert 0 < kept < drafts  # kept and rejected drafts both happened
    assert runs < 3 * 63  # 64 tokens a request, the first from the prefill
    assert [steps for steps, _ in drafted] == plain
    assert [steps for steps, _ in batched] == plain
    assert all(len(steps) == 64 for steps in plain)  # a step a token, drafted or not


async def test_a_stop_inside_a_kept_draft_ends_the_answer_there(
    tiny_fused, tokenizer, monkeypatch
) -> None:
    """max_tokens and stop tokens land exactly where plain decoding puts them."""
    from nbresponses.runtime import scheduler

    prompt = chat_ids(tokenizer, PROMPTS[0])
    async with TokenGenerator(tiny_fused, tokenizer=tokenizer, prefix_cache_bytes=0) as engine:
        engine.speculation = False
        full, _ = await _steps(engine, prompt, SamplingParams(max_tokens=64, temperature=0))
        answer = [t for s in full for t in s.token_ids]
        _Oracle.answers = {tuple(prompt): answer}
        monkeypatch.setattr(scheduler, "Drafter", _Oracle)
        engine.speculation = True
        for n in (1, 2, 7, 33):
            short, _ = await _steps(engine, prompt, SamplingParams(max_tokens=n, temperature=0))
            assert [t for s in short for t in s.token_ids] == answer[:n]
            assert short[-1].finish_reason == "length"
        stop = answer[20]
        first = answer.index(stop)
        params = SamplingParams(max_tokens=64, temperature=0, stop_token_ids=(stop,))
        stopped, _ = await _steps(engine, prompt, params)
    assert [t for s in stopped for t in s.token_ids] == answer[: first + 1]
    assert stopped[-1].finish_reason == "stop"


async def test_sampling_and_grammars_do_not_draft(tiny_fused, tokenizer) -> None:
    prompt = chat_ids(tokenizer, PROMPTS[0])
    params = SamplingParams(max_tokens=48, temperature=0.8, seed=3)
    async with TokenGenerator(tiny_fused, tokenizer=tokenizer, prefix_cache_bytes=0) as engine:
        _, stats = await _steps(engine, prompt, params)
    assert stats.draft_tokens == 0


class _EvenIds:
    """A toy grammar: only even token ids may come next."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.error = None

    def fill_mask(self, mask) -> None:
        mask[:] = 0x55555555  # bits 0, 2, 4, ... of every word

    def accept(self, token_id: int) -> None:
        assert token_id % 2 == 0


async def test_drafting_rows_leave_their_batch_mates_alone(
    tiny_fused, tokenizer, monkeypatch
) -> None:
    """A sampled row, a row asking for logprobs and a row under a grammar share wide steps
    with drafting rows and get what they get alone; the drafting rows get plain decoding's
    steps."""
    from nbresponses.runtime import scheduler

    greedy = SamplingParams(max_tokens=40, temperature=0, top_logprobs=2)
    sampled = SamplingParams(max_tokens=40, temperature=0.9, seed=11, logprobs=True)
    prompts = [chat_ids(tokenizer, text) for text in PROMPTS[:3]]
    async with TokenGenerator(tiny_fused, tokenizer=tokenizer, prefix_cache_bytes=0) as engine:
        vocab = engine.runner.vocab_size
        even = SamplingParams(
            max_tokens=40, temperature=0, logprobs=True, constraint=lambda: _EvenIds(vocab)
        )
        engine.speculation = False
        plain = [(await _steps(engine, p, greedy))[0] for p in prompts[:2]]
        alone, _ = await _steps(engine, prompts[2], sampled)
        alone_even, _ = await _steps(engine, prompts[2], even)
        _Oracle.answers = {
            tuple(p): [t for s in steps for t in s.token_ids]
            for p, steps in zip(prompts, plain, strict=False)
        }
        monkeypatch.setattr(scheduler, "Drafter", _Oracle)
        engine.speculation = True
        together = await asyncio.gather(
            _steps(engine, prompts[0], greedy),
            _steps(engine, prompts[2], sampled),
            _steps(engine, prompts[1], greedy),
            _steps(engine, prompts[2], even),
        )
    assert together[0][0] == plain[0] and together[2][0] == plain[1]
    assert together[1][0] == alone
    assert together[3][0] == alone_even
    assert all(t % 2 == 0 for s in alone_even for t in s.token_ids)
    assert together[0][1].accepted_draft_tokens > 0
    assert together[1][1].draft_tokens == 0
    assert together[3][1].draft_tokens == 0


async def test_a_row_at_the_end_of_the_context_bounds_the_step(
    tiny_fused, tokenizer, monkeypatch
) -> None:
    """A wide step pads every row to its width; a row about to reach the context's end must
    not be fed positions past it, so the step narrows (and both rows stay exact)."""
    from nbresponses.runtime import scheduler

    params = SamplingParams(max_tokens=512, temperature=0)
    short = chat_ids(tokenizer, PROMPTS[0])
    long = chat_ids(tokenizer, " ".join([PROMPTS[1]] * 60))
    async with TokenGenerator(tiny_fused, tokenizer=tokenizer, prefix_cache_bytes=0) as engine:
        long = long[: engine.context_length - 24]  # 24 tokens of room left
        engine.speculation = False
        plain = [(await _steps(engine, p, params))[0] for p in (short, long)]
        _Oracle.answers = {
            tuple(p): [t for s in steps for t in s.token_ids]
            for p, steps in zip((short, long), plain, strict=True)
        }
        monkeypatch.setattr(scheduler, "Drafter", _Oracle)
        engine.speculation = True
        together = await asyncio.gather(_steps(engine, short, params), _steps(engine, long, params))
    assert plain[1][-1].finish_reason == "length"
    assert [steps for steps, _ in together] == plain
