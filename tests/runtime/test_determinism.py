"""A request's tokens and logprobs are a function of the request alone, on every recipe.

Every recipe is exact: the fused graphs batched (end-padded KV), the Optimum graphs one row per
run, dynamic int8 without prefix reuse (its activation scales couple the tokens of a run).

The tiny model runs the whole matrix (``determinism.py``) in seconds per recipe; prefill runs
are made short (``PREFILL_CHUNK``) so prompts span several of them and prefix hits start
mid-run, and mates have other lengths so batches are ragged. The real model runs the same
matrix in ``test_determinism_integration.py``.
"""

from __future__ import annotations

import pytest
from helpers.determinism import one_row_kernel_differs, run_matrix
from helpers.engine import PROMPTS, chat_ids

from nbresponses.models.prepare import prepare_model
from nbresponses.models.recipes import RECIPES
from nbresponses.runtime import scheduler
from nbresponses.tokens.contract import SamplingParams

GREEDY = SamplingParams(max_tokens=16, temperature=0, logprobs=True, top_logprobs=4)
SEEDED = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.95, seed=7, logprobs=True)


@pytest.fixture(autouse=True)
def short_prefill_runs(monkeypatch):
    monkeypatch.setattr(scheduler, "PREFILL_CHUNK", 16)
    monkeypatch.setattr(scheduler, "IDLE_CHUNK", 6)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
async def test_matrix_on_the_tiny_model(recipe, params, tiny_source, cache_dir, tokenizer, request):
    if recipe == "fused-q4" and one_row_kernel_differs(4):
        # measured on an AVX2-only CPU: ONNX Runtime's 4-bit kernel computes a lone row (a
        # batch-1 decode step) in another order than the same row among others; the fused
        # graph's other recipes are row-exact there too (docs/concepts/determinism.md)
        request.applymarker(
            pytest.mark.xfail(
                strict=True, reason="this CPU's one-row 4-bit MatMulNBits kernel is not row-exact"
            )
        )
    prepared = prepare_model(tiny_source, recipe, cache_dir=cache_dir, progress=False)
    prompts = [chat_ids(tokenizer, text) for text in PROMPTS]
    targets = [prompts[0], prompts[4]]  # 37 and 53 tokens
    mates = [prompts[1], prompts[3], prompts[5]]
    follow_up = chat_ids(tokenizer, "And why?")[1:]
    failures = await run_matrix(
        prepared, tokenizer, targets, mates, params, follow_up, max_batch_size=6
    )
    assert not failures, "\n".join(failures)
