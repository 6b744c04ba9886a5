"""Shared helpers for the engine tests: collect streams, PyTorch references."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np

from nbresponses.tokens.contract import GenerationStats, SamplingParams, Step

PROMPTS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
    "Hi",
    "Explain in one sentence why the sky is blue, and then say why sunsets are red.",
    "2 + 2 =",
)


def chat_ids(tokenizer, text: str) -> list[int]:
    return list(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True
        )
    )


async def collect(
    engine, prompt: Sequence[int], params: SamplingParams
) -> tuple[list[Step], GenerationStats]:
    """The steps, and the stats the final one carries."""
    steps = [step async for step in engine.generate(prompt, params)]
    assert steps[-1].stats is not None
    return steps, steps[-1].stats


async def alone_then_batched(engine, prompts, params) -> tuple[list, list]:
    """Each prompt's steps alone, one after another; then every prompt twice at once, the
    second copies joining 20 ms apart (at other steps, beside requests of other lengths)."""
    alone = [(await collect(engine, p, params))[0] for p in prompts]

    async def later(prompt, delay: float):
        await asyncio.sleep(delay)
        return (await collect(engine, prompt, params))[0]

    batched = await asyncio.gather(
        *(later(p, 0.0) for p in prompts), *(later(p, 0.02 * i) for i, p in enumerate(prompts))
    )
    return alone, list(batched)


def tokens(steps: list[Step]) -> list[int]:
    return [t for s in steps for t in s.token_ids]


async def run_all(engine, prompts, params) -> list[list[int]]:
    results = await asyncio.gather(*(collect(engine, p, params) for p in prompts))
    return [tokens(steps) for steps, _ in results]


def torch_greedy(model, prompt: Sequence[int], max_new_tokens: int, eos: int | None) -> list[int]:
    import torch

    with torch.no_grad():
        out = model.generate(
            torch.tensor([list(prompt)]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=eos,
        )
    return out[0, len(prompt) :].tolist()


def torch_logprobs(model, prompt: Sequence[int], generated: Sequence[int]) -> np.ndarray:
    """[len(generated), V] float32 log-softmax of the logits that predicted each generated token."""
    import torch

    ids = torch.tensor([list(prompt) + list(generated)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, dim=-1).numpy()


async def settle(engine, timeout: float = 10.0) -> None:
    """Wait until the worker has removed every finished row (it does so right after the step)."""
    for _ in range(int(timeout / 0.005)):
        if engine.running == 0 and engine.waiting == 0:
            return
        await asyncio.sleep(0.005)


async def score_at_once(generator, documents, *, start: int = 1, top_logprobs: int = 3):
    """Score ``documents`` (token ids) from ``start`` on, queued in one admission round (the
    worker waits on the scheduler's lock while they are queued, so it takes them together).
    Each document's steps."""
    with generator._scheduler._cond:
        streams = [generator.score(d, start=start, top_logprobs=top_logprobs) for d in documents]
    return [await steps_of(stream) for stream in streams]


async def steps_of(stream) -> list[Step]:
    """Every step of a stream, to its end."""
    return [step async for step in stream]


def scored_numbers(steps: Sequence[Step]) -> list[tuple]:
    """Every scored token of a scoring's steps: id, logprob, rank, entropy and alternatives."""
    return [
        (lp.token_id, lp.logprob, lp.rank, lp.entropy, lp.top)
        for step in steps
        for lp in step.logprobs
    ]
