"""Recipes on models larger than the bundled one, in one run: prepare, scoring, decode.

No hub: a randomly initialised model of a real model's shape is built with transformers (seeded,
saved once with the bundled tokenizer, so a 49,152 vocabulary), then, for each recipe in
``--recipes``:

- prepare into a fresh cache, in a child process: wall time and peak RSS (``VmHWM``);
- ``Engine.load`` of the prepared model in another child process: its peak RSS (Binder gives
  2 GB to the whole kernel);
- scoring: ``engine.score_many(method="prefill")`` over ``score.py``'s corpus (tokens/s);
- decode: 64 greedy tokens (``ignore_eos``) at batch 1 (tok/s after the first token) and 16
  requests at once (aggregate tok/s, p50 time to first token), cold (no prefix cache), with the
  engine's speculation as ``--speculation`` says (each setting in turn, every round).

Random weights give random text: the figures are about speed and memory, not answers. And a
random model repeats itself, so prompt-lookup speculation keeps many of its drafts at batch 1
(the table's "x1 tokens a step": 1 + the drafted tokens kept, per step): there x1 measures
speculation on degenerate text more than the model's steps, and a real model's answers repeat
far less (the bundled model's chat answers: ~1.07 tokens a step). ``--speculation off`` gives
the plain steps' ratio.

    python benchmarks/larger.py --shapes qwen3-0.6b --recipes fused-q8 fused-int8
    python benchmarks/larger.py --recipes fused-int8-kernel --speculation on off
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from score import corpus

SHAPES: dict[str, dict[str, Any]] = {
    # Qwen3-0.6B's shape (490M parameters with this vocabulary)
    "qwen3-0.6b": {
        "model_type": "qwen3",
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "tie_word_embeddings": True,
        "rope_theta": 1_000_000.0,
    },
    # Llama-3.2-1B's shape (1.0B parameters with this vocabulary)
    "llama-3.2-1b": {
        "model_type": "llama",
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "tie_word_embeddings": True,
        "rope_theta": 500_000.0,
    },
}


def model_folder(shape: str, root: Path) -> Path:
    """The seeded random model of ``shape`` as a Hugging Face folder (built once)."""
    folder = root / f"random-{shape}"
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from nbresponses.models.prepare import tokenizer_folder

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_folder()))
    spec = dict(SHAPES[shape])
    config = AutoConfig.for_model(
        spec.pop("model_type"),
        vocab_size=len(tokenizer),
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **spec,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    tmp.rename(folder)
    return folder


# A child's own peak RSS: VmHWM, which exec resets. Not ``getrusage``'s ``ru_maxrss``: Linux
# carries the parent's peak across fork and exec into it, so a child of this process (which
# holds the random model) reported at least the parent's size (earlier tables' peaks).
PEAK = (
    "print(next(int(line.split()[1]) for line in open('/proc/self/status') "
    "if line.startswith('VmHWM')))"
)


def prepare_child(folder: Path, recipe: str, cache: Path) -> dict[str, float]:
    """Prepare in a child process: its wall time and peak RSS."""
    code = (
        "import sys; from nbresponses.models.prepare import prepare_model; "
        "prepare_model(sys.argv[1], sys.argv[2], cache_dir=sys.argv[3], progress=False)\n" + PEAK
    )
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code, str(folder), recipe, str(cache)],
        check=True,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - start
    peak_kib = int(done.stdout.split()[-1])
    return {"prepare_s": seconds, "prepare_peak_gb": peak_kib / 2**20}


def load_child(folder: Path, recipe: str, cache: Path) -> dict[str, float]:
    """``Engine.load`` of the prepared model in a child process: its peak RSS."""
    code = (
        "import asyncio, sys; import nbresponses as nbr\n"
        "async def main():\n"
        "    engine = await nbr.Engine.load(sys.argv[1], quantization=sys.argv[2], "
        "cache_dir=sys.argv[3], progress=False, store_path='memory')\n"
        "    await engine.aclose()\n"
        "asyncio.run(main())\n" + PEAK
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(folder), recipe, str(cache)],
        check=True,
        capture_output=True,
        text=True,
    )
    return {"load_peak_gb": int(done.stdout.split()[-1]) / 2**20}


async def measure(
    folder: Path, recipe: str, cache: Path, rounds: int, speculation: list[str]
) -> dict[str, float]:
    """Scoring tok/s (``score``), and per speculation setting ``s`` (``on``, ``off``): ``x1 s``,
    ``x1 tokens a step s``, ``x16 s``, ``ttft16 s``; medians over ``rounds`` after a warm-up."""
    import nbresponses as nbr
    from nbresponses.tokens.contract import SamplingParams

    # cold, as decode.py: no prefix cache, so every request prefills its prompt (the repeated
    # prompts below would otherwise hit it, and more of them where a token's KV is smaller)
    engine = await nbr.Engine.load(
        str(folder),
        quantization=recipe,
        cache_dir=str(cache),
        progress=False,
        store_path="memory",
        prefix_cache_bytes=0,
    )
    texts = corpus()
    out: dict[str, list[float]] = {"score": []}
    generator = engine.generator
    family = engine.client().family
    prompts = [family.encode(t)[:200] for t in texts]
    params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)

    async def one(prompt: list[int]) -> tuple[float, float, int, float]:
        """Time to the first token, decode seconds after it, tokens, tokens a step."""
        start = time.perf_counter()
        first, count, per_step = 0.0, 0, 1.0
        async for step in generator.generate(prompt, params):
            if not first:
                first = time.perf_counter()
            count += len(step.token_ids)
            if step.stats is not None:  # the last step's; the first token is the prefill's
                decoded = step.stats.output_tokens - 1
                steps = decoded - step.stats.accepted_draft_tokens
                per_step = decoded / max(1, steps)
        return first - start, time.perf_counter() - first, count, per_step

    for _ in range(rounds + 1):  # the first round warms up
        start = time.perf_counter()
        scored = [s async for s in engine.score_many(texts, method="prefill", progress=False)]
        tokens = sum(len(s.output[0].content[0].logprobs) for s in scored)
        out["score"].append(tokens / (time.perf_counter() - start))
        for setting in speculation:
            generator.speculation = setting == "on"
            _, decode_s, count, per_step = await one(prompts[0])
            out.setdefault(f"x1 {setting}", []).append((count - 1) / decode_s)
            out.setdefault(f"x1 tokens a step {setting}", []).append(per_step)
            start = time.perf_counter()
            results = await asyncio.gather(*(one(prompts[i % len(prompts)]) for i in range(16)))
            out.setdefault(f"x16 {setting}", []).append(
                sum(r[2] for r in results) / (time.perf_counter() - start)
            )
            out.setdefault(f"ttft16 {setting}", []).append(
                statistics.median(r[0] for r in results) * 1000
            )
    await engine.aclose()
    return {k: statistics.median(v[1:]) for k, v in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["qwen3-0.6b"], choices=list(SHAPES))
    parser.add_argument("--recipes", nargs="+", default=["fused-q8", "fused-int8"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--root", type=Path, default=None, help="where models are built")
    parser.add_argument(
        "--speculation",
        nargs="+",
        choices=["on", "off"],
        default=["on"],
        help="the engine's speculation for the decode figures (each setting in turn)",
    )
    args = parser.parse_args()
    from nbresponses.models.cache import cache_root

    root = args.root or cache_root(None) / "benchmarks"
    rows = []
    for shape in args.shapes:
        folder = model_folder(shape, root)
        for recipe in args.recipes:
            with tempfile.TemporaryDirectory(dir=root) as cache:
                row = {"shape": shape, "recipe": recipe}
                row.update(prepare_child(folder, recipe, Path(cache)))
                row.update(load_child(folder, recipe, Path(cache)))
                row.update(
                    asyncio.run(measure(folder, recipe, Path(cache), args.rounds, args.speculation))
                )
            print(json.dumps(row), flush=True)
            rows.append(row)
    print(
        "\n| shape | recipe | prepare | peak RSS | load peak RSS | scoring tok/s | speculation "
        "| x1 tok/s | x1 tokens a step | x16 tok/s | x16 / x1 | x16 TTFT p50 |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    for r in rows:
        for setting in args.speculation:
            x1, x16 = r[f"x1 {setting}"], r[f"x16 {setting}"]
            print(
                f"| {r['shape']} | {r['recipe']} | {r['prepare_s']:.0f} s | "
                f"{r['prepare_peak_gb']:.2f} GB | {r['load_peak_gb']:.2f} GB | "
                f"{r['score']:.0f} | {setting} | {x1:.1f} | "
                f"{r[f'x1 tokens a step {setting}']:.2f} | {x16:.1f} | {x16 / x1:.2f}x | "
                f"{r[f'ttft16 {setting}']:.0f} ms |"
            )


if __name__ == "__main__":
    main()
