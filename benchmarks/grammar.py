"""Constrained decoding: grammar engines compared, and the mask's cost inside the engine.

Part 1 compares llguidance with xgrammar (when importable; ``pip install --target DIR --no-deps
xgrammar apache-tvm-ffi`` and ``--xgrammar-path DIR`` keeps it out of the venv) on the bundled
SmolLM2 tokenizer, both given the same token bytes: tokenizer set-up, schema compile time, and
the per-token mask time while replaying a valid document of SCHEMA (nested objects, enums,
arrays, strings).

Part 2 measures what the mask costs the engine's decode loop, on the critical path: the wait
for the helper thread's masks after the model step, applying the mask to the logits, and
advancing the matcher (``runtime/constraints.py`` timed from the inside), as a share of decode
time, at batch 1 (one constrained request; and one whose budget is too short for its answer, so
budget-aware closing looks for the way to the end and checks the last choices: ``admit``) and at
16 concurrent (8 constrained, 8 free). Rounds alternate; medians are reported.

    python benchmarks/grammar.py --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time

import numpy as np

from nbresponses.families.chat.family import ChatFamily
from nbresponses.families.chat.grammar import chat_grammar
from nbresponses.grammar import Grammar
from nbresponses.models.prepare import prepare_model
from nbresponses.runtime import constraints
from nbresponses.runtime.generator import TokenGenerator
from nbresponses.tokens.contract import SamplingParams

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "role": {"type": "string", "enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "zip": {"type": "string"},
                "geo": {
                    "type": "object",
                    "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                    "required": ["lat", "lon"],
                    "additionalProperties": False,
                },
            },
            "required": ["city", "zip", "geo"],
            "additionalProperties": False,
        },
        "pets": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "kind": {"type": "string", "enum": ["cat", "dog", "fish"]},
                    "name": {"type": "string"},
                },
                "required": ["kind", "name"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["name", "age", "role", "tags", "address", "pets"],
    "additionalProperties": False,
}
DOCUMENT = {
    "name": "Ada Lovelace",
    "age": 36,
    "role": "admin",
    "tags": ["math", "poetry", "engines"],
    "address": {"city": "London", "zip": "W1", "geo": {"lat": 51.5, "lon": -0.12}},
    "pets": [{"kind": "cat", "name": "Puff"}, {"kind": "dog", "name": "Rex"}],
}
PROMPT = "Invent a person record: name, age, role, tags, address with geo, and pets."
FREE = "Write a short story about a lighthouse keeper."


def _us(values: list[float]) -> str:
    median, p90 = 1e6 * statistics.median(values), 1e6 * np.percentile(values, 90)
    return f"median {median:.1f} us, p90 {p90:.1f} us"


def compare_engines(family: ChatFamily, tokenizer, xgrammar_path: str | None) -> None:
    import llguidance

    size = max(tokenizer.get_vocab().values()) + 1
    vocab = [bytes(family._bytes.get(i)[1]) for i in range(size)]
    ids = tokenizer.encode(json.dumps(DOCUMENT), add_special_tokens=False)
    print(f"document: {len(ids)} tokens; vocabulary {size}")
    t0 = time.perf_counter()
    gt = family.grammar_tokenizer()
    print(f"llguidance: tokenizer {time.perf_counter() - t0:.3f} s")
    for _ in range(3):
        t0 = time.perf_counter()
        grammar = Grammar.json_schema(gt, SCHEMA)
        matcher = grammar.matcher()
        compile_s = time.perf_counter() - t0
        mask = np.zeros((gt.vocab_size + 31) // 32, np.int32)
        times = []
        for token in ids:
            t = time.perf_counter()
            matcher.fill_mask(mask)
            times.append(time.perf_counter() - t)
            matcher.accept(token)
        assert matcher.error is None, matcher.error
        print(f"  compile {1e3 * compile_s:.2f} ms; mask {_us(times)}")
    del llguidance
    if xgrammar_path:
        sys.path.append(xgrammar_path)
    try:
        import xgrammar as xgr
    except ImportError:
        print("xgrammar: not importable (skipped)")
        return
    t0 = time.perf_counter()
    info = xgr.TokenizerInfo(
        vocab, vocab_type=xgr.VocabType.RAW, vocab_size=size, stop_token_ids=[2]
    )
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    print(
        f"xgrammar {xgr.__version__ if hasattr(xgr, '__version__') else ''}: tokenizer "
        f"{time.perf_counter() - t0:.3f} s"
    )
    for _ in range(3):
        t0 = time.perf_counter()
        compiled = compiler.compile_json_schema(
            json.dumps(SCHEMA), any_whitespace=False, separators=(", ", ": ")
        )
        m = xgr.GrammarMatcher(compiled)
        compile_s = time.perf_counter() - t0
        bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)
        times = []
        for token in ids:
            t = time.perf_counter()
            m.fill_next_token_bitmask(bitmask)
            times.append(time.perf_counter() - t)
            assert m.accept_token(token), token
        print(f"  compile {1e3 * compile_s:.2f} ms; mask {_us(times)}")


class Clock:
    """Time spent on the decode loop's critical path for masks (patched into constraints)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._wait = constraints.Pending.wait
        self._masked = constraints.RowConstraint.masked
        self._accept = constraints.RowConstraint.accept
        self._admit = constraints.RowConstraint.admit

    def __enter__(self) -> Clock:
        clock = self

        def timed(original):
            def run(*args, **kwargs):
                t = time.perf_counter()
                try:
                    return original(*args, **kwargs)
                finally:
                    clock.seconds += time.perf_counter() - t

            return run

        constraints.Pending.wait = timed(self._wait)  # type: ignore[method-assign]
        constraints.RowConstraint.masked = timed(self._masked)  # type: ignore[method-assign]
        constraints.RowConstraint.accept = timed(self._accept)  # type: ignore[method-assign]
        constraints.RowConstraint.admit = timed(self._admit)  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        constraints.Pending.wait = self._wait  # type: ignore[method-assign]
        constraints.RowConstraint.masked = self._masked  # type: ignore[method-assign]
        constraints.RowConstraint.accept = self._accept  # type: ignore[method-assign]
        constraints.RowConstraint.admit = self._admit  # type: ignore[method-assign]


async def _one(generator, prompt, params) -> int:
    steps = [step async for step in generator.generate(prompt, params)]
    assert steps[-1].stats is not None
    return steps[-1].stats.output_tokens


async def mask_cost(generator, family, tokenizer, rounds: int, max_tokens: int) -> None:
    text = chat_grammar(
        answer=SCHEMA, tools=[], mode="none", forced_tool=None, parallel=True, prefill=""
    )
    assert text is not None
    grammar = Grammar.lark(family.grammar_tokenizer(), text)

    def ids(q: str) -> list[int]:
        return list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": q}], add_generation_prompt=True
            )
        )

    constrained = SamplingParams(max_tokens=max_tokens, temperature=0, constraint=grammar)
    free = SamplingParams(max_tokens=max_tokens, temperature=0)
    # a budget the answer does not fit: budget-aware closing checks the last choices
    closed = SamplingParams(max_tokens=48, temperature=0, constraint=grammar)
    cases = {
        "batch 1 (constrained)": [(ids(PROMPT), constrained)],
        "batch 1 (constrained, closed by a 48-token budget)": [(ids(PROMPT), closed)],
        "16 concurrent (8 constrained, 8 free)": [
            (ids(f"{PROMPT} Number {i}."), constrained if i % 2 == 0 else free) for i in range(16)
        ],
    }
    await _one(generator, ids("Hi"), free)  # warm-up
    results: dict[str, list[tuple[float, float, int]]] = {k: [] for k in cases}
    for _ in range(rounds):
        for name, jobs in cases.items():
            with Clock() as clock:
                t0 = time.perf_counter()
                counts = await asyncio.gather(*(_one(generator, p, s) for p, s in jobs))
                wall = time.perf_counter() - t0
            results[name].append((clock.seconds, wall, sum(counts)))
    for name, runs in results.items():
        share = statistics.median(c / w for c, w, _ in runs)
        tps = statistics.median(n / w for _, w, n in runs)
        per_token = statistics.median(1e6 * c / n for c, _, n in runs)
        print(
            f"{name}: mask on the critical path {100 * share:.2f}% of the run "
            f"({per_token:.0f} us per generated token); {tps:.0f} tok/s aggregate"
        )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--xgrammar-path", default=None)
    args = parser.parse_args()
    prepared = prepare_model(None, progress=False)
    tokenizer = prepared.load_tokenizer()
    generator = TokenGenerator(prepared, prefix_cache_bytes=0)
    family = ChatFamily(tokenizer, eos_token_ids=generator.eos_token_ids)
    compare_engines(family, tokenizer, args.xgrammar_path)
    try:
        await mask_cost(generator, family, tokenizer, args.rounds, args.max_tokens)
    finally:
        await generator.aclose()


if __name__ == "__main__":
    asyncio.run(main())
