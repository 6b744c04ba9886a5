"""Speed and fidelity of every recipe and of the analysis-recipe candidates, in one run.

Fidelity is the prepare-time measure (``nbresponses.models.fidelity``: the broad built-in set,
teacher-forced on reference text and on each model's own greedy output, against the fp32
export). Speed is the engine's: batch-1 decode after a 43-token chat prompt, and the aggregate
of 16 concurrent requests with prompts of 43-183 tokens (``decode.py``'s "x16 mixed"), cold,
greedy, ``--max-tokens`` each, medians of ``--rounds`` rounds taken round-robin.

Candidates beyond the registered recipes (8-bit weights with fp32 activations, mixed fp32 /
8-bit graphs) are built here into ``<cache>/benchmarks`` from the fused fp32 graph: they were
the ways to get near-fp32 logprobs faster than fp32 (docs/concepts/models.md says which won).

    python benchmarks/recipes.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from decode import PROMPT, engine_runner, mixed_prompts

from nbresponses.models.cache import cache_root
from nbresponses.models.fidelity import measure_fidelity
from nbresponses.models.prepare import prepare_model
from nbresponses.models.prepared import PreparedModel
from nbresponses.models.recipes import MODEL_FILE
from nbresponses.runtime.generator import TokenGenerator


@dataclass(frozen=True)
class Built:
    """A candidate graph built here: the fused graph with these MatMulNBits settings."""

    bits: int
    accuracy_level: int
    block_size: int = 32
    quantize_head: bool = True
    keep_fp32: Callable[[str], bool] | None = None


CANDIDATES: dict[str, str | Built] = {
    "fused-fp32 (= analysis)": "fused-fp32",
    "fused-q8 (default)": "fused-q8",
    "fp32 (Optimum export)": "fp32",
    "q8 (Optimum graph)": "q8",
    "q8-fp32-head": "q8-fp32-head",
    "fused-q4": "fused-q4",
    "q4": "q4",
    "dynamic-int8": "dynamic-int8",
    "fused, 8-bit weights, fp32 activations": Built(8, accuracy_level=0),
    "fused, 8-bit block 16, fp32 head + activations": Built(
        8, accuracy_level=0, block_size=16, quantize_head=False
    ),
    "fused fp32, o_proj 8-bit": Built(8, accuracy_level=4, keep_fp32=lambda n: n.endswith("/o")),
}


def _build(name: str, spec: Built, fp32: PreparedModel, export: Path, root: Path) -> PreparedModel:
    """A prepared folder (the fp32 model's tokenizer and config) around the built graph."""
    import onnx

    from nbresponses.models.recipes import quantize_nbits

    folder = root / "benchmarks" / name.replace(" ", "_").replace(",", "").replace("/", "-")
    if (folder / "manifest.json").is_file():
        return PreparedModel.open(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for item in fp32.path.iterdir():
        if item.is_file() and item.name not in (MODEL_FILE, "manifest.json"):
            shutil.copy2(item, folder / item.name)
    keep = spec.keep_fp32
    model = quantize_nbits(
        onnx.load(str(fp32.onnx_path)),
        spec.bits,
        quantize_head=spec.quantize_head,
        block_size=spec.block_size,
        accuracy_level=spec.accuracy_level,
        keep_fp32=(lambda n: not keep(n)) if keep else None,  # keep_fp32 names what is quantized
    )
    model.save_model_to_file(str(folder / MODEL_FILE), use_external_data_format=False)
    tokenizer = fp32.load_tokenizer()
    fidelity = measure_fidelity(export, folder / MODEL_FILE, tokenizer).as_dict()
    manifest = {
        **fp32.manifest,
        "recipe": {"name": name, "description": f"benchmark candidate: {spec}"},
        "fidelity": fidelity,
        "size_bytes": (folder / MODEL_FILE).stat().st_size,
    }
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str))
    return PreparedModel.open(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--only", nargs="*", default=None, help="candidate names to run")
    args = parser.parse_args()

    root = cache_root(args.cache_dir)
    fp32 = prepare_model(None, "fused-fp32", cache_dir=args.cache_dir, progress=False)
    export = prepare_model(None, "fp32", cache_dir=args.cache_dir, progress=False).onnx_path
    models: dict[str, PreparedModel] = {}
    for name, spec in CANDIDATES.items():
        if args.only and name not in args.only:
            continue
        if isinstance(spec, str):
            models[name] = prepare_model(None, spec, cache_dir=args.cache_dir, progress=False)
        else:
            models[name] = _build(name, spec, fp32, export, root)
        print(f"{name}: {models[name].fidelity_summary()}", flush=True)

    engines = {name: TokenGenerator(m, prefix_cache_bytes=0) for name, m in models.items()}
    tokenizer = next(iter(engines.values())).tokenizer
    prompt = list(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": PROMPT}], add_generation_prompt=True
        )
    )
    mixed = mixed_prompts(tokenizer)
    runs = {}
    for name, engine in engines.items():
        runs[(name, "x1")] = engine_runner(engine, [prompt], args.max_tokens)
        runs[(name, "x16 mixed")] = engine_runner(engine, mixed, args.max_tokens)
    for run in runs.values():  # warm-up
        run()
    samples: dict[tuple[str, str], list[float]] = {key: [] for key in runs}
    for _ in range(args.rounds):
        for key, run in runs.items():
            result = run()
            samples[key].append(result["decode_tps" if key[1] == "x1" else "aggregate_tps"])
    for engine in engines.values():
        engine.close_sync()
    _report(models, {k: statistics.median(v) for k, v in samples.items()}, args)


def _report(models: dict[str, PreparedModel], speed: dict, args: argparse.Namespace) -> None:
    default = speed.get(("fused-q8 (default)", "x1"))
    print(
        f"\n{args.rounds} rounds, {args.max_tokens} greedy tokens per request, cold prompts; "
        "fidelity vs the fp32 export on the built-in set"
    )
    print(
        f"| {'candidate':46} | size MB | top-1 (95% CI) | mean abs dlogprob | p99 | KL | "
        "x1 tok/s | x16 mixed tok/s | x1 vs default |"
    )
    print("|" + "---|" * 9)
    for name, m in models.items():
        f = m.fidelity
        low, high = f["top1_ci95"]
        one, many = speed[(name, "x1")], speed[(name, "x16 mixed")]
        print(
            f"| {name:46} | {m.size_bytes / 1e6:.0f} | {f['top1_agreement']:.1%} "
            f"({low:.1%}-{high:.1%}) | {f['mean_abs_dlogprob']:.4f} | "
            f"{f['p99_abs_dlogprob']:.3f} | {f['mean_kl']:.4f} | {one:.1f} | {many:.1f} | "
            + (f"{one / default:.2f}x |" if default else "- |")
        )


if __name__ == "__main__":
    main()
