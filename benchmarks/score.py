"""Tokens scored per second: the engine's scorings against llama.cpp and PyTorch, in one run.

The corpus is the built-in fidelity set's conversations (``models/fidelity_set.py``), joined
into 8 documents of about 370 tokens (~2,900 tokens in all; ``--documents 8``: 16 of about 185;
``--words 8``: 64 texts of 8 words), scored as plain text: the logprob of every token given the
ones before it. Systems, round-robin, medians of ``--rounds``:

- the engine (``Engine.score_many``), for each recipe in ``--recipes``, ``method="prefill"``
  (every position in prefill runs; short texts queued together share runs) and
  ``method="decode"`` (each token as a generation step, 8 documents batched), with exact ranks
  and entropies; with ``--alone``, also prefill with every text in runs of its own;
- llama.cpp (``llama-cpp-python``, when installed) on the bundled model requantized to Q8_0:
  one ``eval`` of each document with ``logits_all`` and a numpy log-softmax;
- PyTorch fp32: one forward pass per document and ``log_softmax``.

It also prints how far each engine scoring is from PyTorch fp32 (mean and max |Δ logprob|).

    python benchmarks/score.py --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from decode import bundled_q8_0_gguf

import nbresponses as nbr
from nbresponses.models.fidelity_set import FIDELITY_SET
from nbresponses.models.prepare import prepare_model
from nbresponses.runtime.generator import TokenGenerator


def corpus(documents: int = 4) -> list[str]:
    """The set's turns (questions and answers) in ``documents`` documents, and again in
    reverse order (other contexts, so other logprobs): ~2,500 tokens."""
    turns = [m["content"] for s in FIDELITY_SET for m in s.messages]
    forward = ["\n\n".join(turns[i::documents]) for i in range(documents)]
    backward = ["\n\n".join(turns[::-1][i::documents]) for i in range(documents)]
    return forward + backward


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def short_texts(words: int, most: int = 64) -> list[str]:
    """The corpus's words in texts of ``words`` words each (at most ``most`` texts): short
    scorings, as of sentences or minimal pairs, where a run's fixed cost counts."""
    every = " ".join(corpus(4)).split()
    return [" ".join(every[i : i + words]) for i in range(0, len(every) - words + 1, words)][:most]


def engine_runner(
    engine: nbr.Engine, texts: list[str], method: str, together: bool = True
) -> Callable[[], dict]:
    async def run() -> dict:
        if engine.generator.runner.exact_steps:
            engine.generator.scoring_together = together
        start = time.perf_counter()
        scorings = [
            s
            async for s in engine.score_many(texts, method=method, progress=False)  # type: ignore[arg-type]
        ]
        elapsed = time.perf_counter() - start
        logprobs = [
            np.array([lp.logprob for lp in s.output[0].content[0].logprobs]) for s in scorings
        ]
        return {"seconds": elapsed, "tokens": sum(map(len, logprobs)), "logprobs": logprobs}

    return lambda: asyncio.run(run())


def torch_runner(documents: list[list[int]]) -> Callable[[], dict]:
    import torch
    from transformers import AutoModelForCausalLM

    from nbresponses.models.sources import bundled_gguf_path

    gguf = bundled_gguf_path()
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name).eval()

    def run() -> dict:
        start = time.perf_counter()
        out = []
        with torch.no_grad():
            for ids in documents:
                logits = model(torch.tensor([ids])).logits[0, :-1].float()
                lp = torch.log_softmax(logits, dim=-1).numpy()
                out.append(lp[np.arange(len(ids) - 1), ids[1:]])
        elapsed = time.perf_counter() - start
        return {"seconds": elapsed, "tokens": sum(len(x) for x in out), "logprobs": out}

    return run


def llama_runner(gguf: Path, documents: list[list[int]]) -> Callable[[], dict]:
    from llama_cpp import Llama

    llm = Llama(str(gguf), n_ctx=2048, n_batch=512, logits_all=True, verbose=False)

    def run() -> dict:
        start = time.perf_counter()
        out = []
        for ids in documents:
            llm.reset()
            llm.eval(ids)
            logits = np.asarray(llm.scores[: len(ids) - 1], dtype=np.float32)
            out.append(log_softmax(logits)[np.arange(len(ids) - 1), ids[1:]])
        elapsed = time.perf_counter() - start
        return {"seconds": elapsed, "tokens": sum(len(x) for x in out), "logprobs": out}

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--recipes", nargs="+", default=["fused-q8", "analysis"])
    parser.add_argument("--skip", nargs="*", default=[], help="torch llama.cpp")
    parser.add_argument(
        "--documents",
        type=int,
        default=4,
        help="the set's turns in 2x this many documents (4: ~370 tokens each; 8: ~185)",
    )
    parser.add_argument(
        "--words", type=int, default=0, help="short texts of this many words instead (64 at most)"
    )
    parser.add_argument("--methods", nargs="+", default=["prefill", "decode"])
    parser.add_argument(
        "--alone",
        action="store_true",
        help="also prefill with each text in runs of its own (scoring_together off)",
    )
    args = parser.parse_args()

    texts = short_texts(args.words) if args.words else corpus(args.documents)
    engines = {}
    for recipe in args.recipes:
        prepared = prepare_model(None, recipe, progress=False)
        engines[prepared.recipe] = nbr.Engine(TokenGenerator(prepared, prefix_cache_bytes=0))
    first = next(iter(engines.values()))
    # what the engine scores: every token of a document after one end-of-text token
    jobs = [asyncio.run(first.scoring.prepare(t)) for t in texts]
    documents = [[*job.prompt, *job.given] for job in jobs]
    print(f"corpus: {len(texts)} documents, {sum(len(d) - 1 for d in documents)} tokens scored")

    systems: dict[str, Callable[[], dict]] = {}
    for recipe, engine in engines.items():
        for method in args.methods:
            systems[f"engine {recipe} {method}"] = engine_runner(engine, texts, method)
        if args.alone and "prefill" in args.methods and engine.generator.runner.exact_steps:
            systems[f"engine {recipe} prefill, each text alone"] = engine_runner(
                engine, texts, "prefill", together=False
            )
    if "llama.cpp" not in args.skip:
        try:
            gguf = bundled_q8_0_gguf(first.prepared.path.parent.parent / "llama.cpp")
            systems["llama.cpp Q8_0"] = llama_runner(gguf, documents)
        except ImportError:
            print("llama-cpp-python is not installed: llama.cpp skipped")
    if "torch" not in args.skip:
        systems["pytorch fp32"] = torch_runner(documents)

    results: dict[str, list[dict]] = {name: [] for name in systems}
    for run in systems.values():  # warm-up
        run()
    for _ in range(args.rounds):
        for name, run in systems.items():
            results[name].append(run())
    reference = results["pytorch fp32"][0]["logprobs"] if "pytorch fp32" in results else None
    llama = "llama.cpp Q8_0" if "llama.cpp Q8_0" in results else None
    speed = {
        name: statistics.median(r["tokens"] / r["seconds"] for r in runs)
        for name, runs in results.items()
    }
    print("\n| system | tokens/s | vs llama.cpp | mean / max abs dlogprob vs PyTorch fp32 |")
    print("|---|---|---|---|")
    for name, runs in results.items():
        ratio = f"{speed[name] / speed[llama]:.2f}x" if llama else "-"
        fidelity = "-"
        if reference is not None:
            ours = np.concatenate(runs[0]["logprobs"])
            theirs = np.concatenate(reference)
            if ours.shape == theirs.shape:
                d = np.abs(ours - theirs)
                fidelity = f"{d.mean():.2e} / {d.max():.2e}"
        print(f"| {name} | {speed[name]:.0f} | {ratio} | {fidelity} |")
    for name in results:
        if name.endswith(", each text alone"):
            shared = results[name.removesuffix(", each text alone")][0]["logprobs"]
            same = all(
                np.array_equal(a, b)
                for a, b in zip(shared, results[name][0]["logprobs"], strict=True)
            )
            print(f"{name.removesuffix(', each text alone')}: the same logprobs alone: {same}")
    for engine in engines.values():
        engine.generator.close_sync()


if __name__ == "__main__":
    main()
