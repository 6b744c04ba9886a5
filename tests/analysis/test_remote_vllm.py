"""``nbr.RemoteEngine`` against a real vLLM CPU server (opt-in): the kernel's tokens, and its
logprobs and choices within bf16 noise.

vLLM serves the bundled model in bf16 (``benchmarks/vllm_peer.py``: the GGUF as a Hugging Face
folder, ``vllm serve`` on loopback with both cores); the kernel runs the same weights in fp32
(the ``analysis`` recipe, ``fused-fp32``), the fair reference for bf16. Opt in with

    NBRESPONSES_VLLM_PYTHON=/work/venvs/vllm/bin/python pytest -s tests/service/test_remote_vllm.py

(the python of a vLLM CPU venv, ``benchmarks/install_vllm.sh``: one server is started for the
module, 80-140 s before it answers), or ``NBRESPONSES_VLLM_URL=http://host:8000/v1`` for a vLLM
server already running that serves this model. ``-s`` shows the measured agreement.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from helpers.paths import ROOT

import nbresponses as nbr

VLLM_PYTHON = os.environ.get("NBRESPONSES_VLLM_PYTHON")
VLLM_URL = os.environ.get("NBRESPONSES_VLLM_URL")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(1800),  # the first test also waits for vLLM to start
    pytest.mark.skipif(
        not (VLLM_PYTHON or VLLM_URL),
        reason="opt-in: set NBRESPONSES_VLLM_PYTHON to a vLLM CPU venv's python "
        "(benchmarks/install_vllm.sh) or NBRESPONSES_VLLM_URL to a running vLLM server's "
        "base URL ending in /v1",
    ),
]

TEXTS = [
    "The Seine flows through Paris and into the English Channel at Le Havre. Its basin covers "
    "much of northern France, and the river was a trade route for centuries.",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen.\nPlants, algae "
    "and some bacteria do it; animals cannot.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))  # prints 5\n",
    "Two plus two is four, and three times three is nine. Ten minus seven is three.",
]
TOP = 5
# Bounds for bf16 against fp32 on the same weights, about twice what vLLM 0.32 CPU measured on
# TEXTS (109 tokens): mean |Δ logprob| 0.031 nats, max 0.18; the same most likely token at
# 96.3% of positions, and at every one where the kernel's two best are > 0.1 nats apart (vLLM
# takes the log-softmax in fp32 of bf16 logits, 8 significant bits: near-ties tie or swap).
MEAN_ABS = 0.06  # mean |Δ logprob| (nats) per token
MAX_ABS = 0.5  # the largest |Δ logprob| of any token
TOP1 = 0.9  # share of positions where both name the same most likely token
MARGIN = 0.1  # ... which must be all of them where the kernel's best leads by more (nats)
PROB = 0.05  # |Δ prob| of an option among the options (measured: at most 0.018)


class Vllm:
    """The server under test: its base URL; ``awake()`` resumes it (when this module started
    it) only while it is asked something, so its idle threads leave the kernel's cores alone."""

    def __init__(self, base_url: str, server: Any = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.server = server

    @contextmanager
    def awake(self) -> Iterator[None]:
        if self.server is not None:
            self.server.resume()
        try:
            yield
        finally:
            if self.server is not None:
                self.server.pause()


def vllm_peer() -> ModuleType:
    """``benchmarks/vllm_peer.py`` (the benchmarks' vLLM folder and server), loaded by path."""
    spec = importlib.util.spec_from_file_location("vllm_peer", ROOT / "benchmarks/vllm_peer.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def vllm(cache_dir: Path) -> Iterator[Vllm]:
    """One vLLM server for the module: the one named by NBRESPONSES_VLLM_URL, else started."""
    if VLLM_URL:
        yield Vllm(VLLM_URL)
        return
    assert VLLM_PYTHON is not None
    peer = vllm_peer()
    log = cache_dir / "vllm-serve.log"
    folder = peer.vllm_model_folder(cache_dir)
    with peer.VllmServer(Path(VLLM_PYTHON), folder, log) as server:
        print(f"\nvLLM answered after {server.startup_s:.0f} s (log: {log})")
        server.pause()
        yield Vllm(server.url + "/v1", server)


@pytest.fixture
async def kernel(bundled_analysis):
    """The bundled model in this kernel on fp32 weights (``analysis``: ``fused-fp32``)."""
    from nbresponses.engine import Engine
    from nbresponses.runtime.generator import TokenGenerator

    async with Engine(TokenGenerator(bundled_analysis), store_path="memory") as engine:
        yield engine


@pytest.fixture
async def remote(vllm, kernel):
    start = kernel.generator.eos_token_ids[0]  # the token the kernel scores plain text after
    async with nbr.RemoteEngine(vllm.base_url, document_start=start) as engine:
        yield engine


def logprobs(scoring) -> list[Any]:
    return scoring.output[0].content[0].logprobs


def agreement(near: list[Any], far: list[Any]) -> dict[str, Any]:
    """How two lists of scorings of the same tokens agree: |Δ logprob|, the top alternative,
    the rank."""
    a = [lp for s in near for lp in logprobs(s)]
    b = [lp for s in far for lp in logprobs(s)]
    assert [lp.token for lp in b] == [lp.token for lp in a]
    delta = np.abs(np.array([x.logprob for x in b]) - np.array([x.logprob for x in a]))
    top1 = [x.top_logprobs[0].token == y.top_logprobs[0].token for x, y in zip(a, b, strict=True)]
    clear = [x.top_logprobs[0].logprob - x.top_logprobs[1].logprob > MARGIN for x in a]
    return {
        "tokens": len(a),
        "mean_abs": float(delta.mean()),
        "max_abs": float(delta.max()),
        "worst": a[int(delta.argmax())].token,
        "top1": float(np.mean(top1)),
        "clear": sum(clear),
        "top1_clear": float(np.mean([t for t, c in zip(top1, clear, strict=True) if c])),
        "rank_equal": float(np.mean([x.rank == y.rank for x, y in zip(a, b, strict=True)])),
    }


async def test_score_gives_the_kernels_tokens_and_logprobs_within_bf16_noise(vllm, kernel, remote):
    family = kernel.client().family
    with vllm.awake():
        far_ids = [await remote.scoring.tokenize(t) for t in TEXTS]  # vLLM's /tokenize
        far = [await remote.score(t, top_logprobs=TOP) for t in TEXTS]
    near = [await kernel.score(t, top_logprobs=TOP, method="prefill") for t in TEXTS]
    assert far_ids == [family.encode(t) for t in TEXTS]
    for f, n in zip(far, near, strict=True):
        assert f.output_text == n.output_text
        assert [(x.token, x.bytes) for x in logprobs(f)] == [
            (x.token, x.bytes) for x in logprobs(n)
        ]
        assert f.usage.input_tokens == n.usage.input_tokens
        assert all(len(x.top_logprobs) == TOP for x in logprobs(f))
    got = agreement(near, far)
    print(
        f"\nscore, vLLM bf16 vs kernel fused-fp32: {got['tokens']} tokens, same ids; "
        f"mean |Δ logprob| {got['mean_abs']:.4f}, max {got['max_abs']:.4f} "
        f"(token {got['worst']!r}); top-1 agreement {got['top1']:.1%}, "
        f"{got['top1_clear']:.1%} of the {got['clear']} positions whose best leads by more than "
        f"{MARGIN} nats; rank equal {got['rank_equal']:.1%}"
    )
    assert got["mean_abs"] < MEAN_ABS
    assert got["max_abs"] < MAX_ABS
    assert got["top1"] >= TOP1
    assert got["top1_clear"] == 1.0
    # vLLM sends each token's rank (its own, 1 = most likely), never an entropy
    entries = [x for s in far for x in logprobs(s)]
    assert all(isinstance(x.rank, int) and x.rank >= 1 for x in entries)
    assert all(x.entropy is None for x in entries)
    assert all((x.rank == 1) == (x.token == x.top_logprobs[0].token) for x in entries)
    frame = nbr.logprobs_frame(far[0])
    assert frame["rank"].notna().all() and frame["entropy"].isna().all()
    assert nbr.logprobs_frame(near[0])["entropy"].notna().all()  # the kernel's has one


QUESTIONS = [
    ("The capital of France is", [" Paris", " London", " Berlin"]),
    ("Question: How many legs does a spider have?\nAnswer:", [" eight", " three", " twelve"]),
    ("Monday, Tuesday, Wednesday,", [" Thursday", " January", " blue"]),
]


async def test_choose_picks_the_kernels_option(vllm, kernel, remote):
    for prompt, options in QUESTIONS:
        near = await kernel.choose(prompt, options, method="prefill", unconditional="")
        with vllm.awake():
            far = await remote.choose(prompt, options, unconditional="")
        assert list(far.index) == options and list(far.columns) == list(near.columns)
        probs = [c for c in near.columns if c.startswith("prob")]
        worst = float(np.abs(far[probs].to_numpy() - near[probs].to_numpy()).max())
        print(
            f"\nchoose {prompt!r}: kernel {near['prob'].idxmax()!r} "
            f"{near['prob'].max():.3f}, vLLM {far['prob'].idxmax()!r} {far['prob'].max():.3f}; "
            f"max |Δ prob| over {len(probs)} normalisations {worst:.4f}"
        )
        assert near["prob"].max() > 0.6  # a clear-cut question, so bf16 noise cannot flip it
        for column in probs:
            first, second = np.sort(near[column].to_numpy())[::-1][:2]
            if first - second > 0.1:  # every normalisation that is clear-cut too
                assert far[column].idxmax() == near[column].idxmax(), (prompt, column)
        assert worst < PROB
        np.testing.assert_allclose(far["tokens"], near["tokens"])


async def test_score_many_and_score_frame_end_to_end(vllm, kernel, remote):
    with vllm.awake():
        many = [s async for s in remote.score_many(TEXTS, top_logprobs=1, progress=False)]
        far = await remote.score_frame(TEXTS, top_logprobs=1, progress=False)
    assert [s.output_text for s in many] == TEXTS  # in input order
    assert all(s.metadata["nbresponses.server"] in vllm.base_url for s in many)
    near = await kernel.score_frame(TEXTS, top_logprobs=1, method="prefill", progress=False)
    assert list(far.columns) == list(near.columns)
    assert far[["document", "token"]].equals(near[["document", "token"]])
    assert sorted(far["document"].unique()) == list(range(len(TEXTS)))
    delta = np.abs(far["logprob"].to_numpy() - near["logprob"].to_numpy())
    print(f"\nscore_frame: {len(far)} rows, mean |Δ logprob| {delta.mean():.4f}")
    assert delta.mean() < MEAN_ABS and delta.max() < MAX_ABS
    assert far["rank"].notna().all() and far["entropy"].isna().all()
    assert near["entropy"].notna().all()


async def test_a_character_split_across_tokens(vllm, kernel, remote):
    """The same ids and logprobs; but vLLM detokenizes incrementally, so the tokens that hold
    the leading bytes of a character come as "" and the last one as the whole character (the
    kernel gives each token its own bytes, ``bytes:\\xe6`` as OpenAI writes them). The text
    the tokens join to is the same."""
    text = "Crème brûlée in Zürich costs 12 €. 日本語"
    with vllm.awake():
        far_ids = await remote.scoring.tokenize(text)
        far = await remote.score(text, top_logprobs=1)
    near = await kernel.score(text, top_logprobs=1, method="prefill")
    assert far_ids == kernel.client().family.encode(text)
    a, b = logprobs(near), logprobs(far)
    assert bytes(x for lp in b for x in lp.bytes) == bytes(x for lp in a for x in lp.bytes)
    split = [i for i, lp in enumerate(a) if lp.token.startswith("bytes:")]
    assert split  # the test text does split characters
    assert all(b[i].token == a[i].token for i in range(len(a)) if i not in split)
    assert [b[i].token for i in split] == ["", "", " 日", "", "", "語"]
    delta = np.abs(np.array([x.logprob for x in b]) - np.array([x.logprob for x in a]))
    print(f"\nsplit characters: {len(a)} tokens, mean |Δ logprob| {delta.mean():.4f}")
    assert delta.mean() < 0.1 and delta.max() < MAX_ABS  # measured: 0.051 over 24 tokens
