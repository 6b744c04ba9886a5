"""Benchmark: logprobs_frame on a synthetic Response with 1M tokens and 5 alternatives each.

Prints the time and rows/s of ``logprobs_frame`` on the SDK object and on its JSON dict, and
the ratio against a naive per-row baseline measured in the same process (timings on shared
machines are noisy; the ratio is what to compare). Target: 1M rows in <= 2 s.

    python benchmarks/frames.py [--tokens 1000000] [--top 5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import codecs
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from openai._models import construct_type
from openai.types.responses import Response

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, uninstalled
from nbresponses.frames import logprobs_frame
from nbresponses.frames._gc import gc_paused

_WORDS = ["the", " capital", " of", " France", " is", " Paris", ".", " é", " 世界", "\n", " 🙂"]


def _vocabulary(size: int, rng: np.random.Generator) -> list[bytes]:
    """Byte strings of distinct tokens, some with multi-byte characters (whole ones)."""
    vocab = dict.fromkeys(w.encode() for w in _WORDS)
    while len(vocab) < size:
        word = "".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), rng.integers(1, 8)))
        vocab[(" " + word).encode()] = None
    return list(vocab)


def synthetic_response(n_tokens: int, k: int, seed: int = 0) -> dict[str, Any]:
    """A Response dict: one output_text with ``n_tokens`` logprobs of ``k`` alternatives each."""
    rng = np.random.default_rng(seed)
    vocab = _vocabulary(4096, rng)
    ids = (rng.integers(0, len(vocab), size=(n_tokens, 1)) + 97 * np.arange(k)) % len(vocab)
    # k alternatives and the rest of the vocabulary: a proper distribution, sorted descending
    probs = rng.dirichlet(np.full(k + 1, 0.5), size=n_tokens)[:, :k]
    lps = np.log(np.maximum(-np.sort(-probs, axis=1), 1e-12)).round(6)
    choice = np.minimum(rng.geometric(0.7, size=n_tokens) - 1, k - 1)
    decoded = {i: b.decode() for i, b in enumerate(vocab)}
    byte_lists = {i: list(b) for i, b in enumerate(vocab)}
    entries = []
    pieces = []
    for row, col, lp_row in zip(ids.tolist(), choice.tolist(), lps.tolist(), strict=True):
        top = [
            {"token": decoded[t], "bytes": byte_lists[t], "logprob": lp}
            for t, lp in zip(row, lp_row, strict=True)
        ]
        chosen = top[col]
        entries.append({**chosen, "top_logprobs": top})
        pieces.append(chosen["token"])
    text = "".join(pieces)
    return {
        "id": "resp_bench",
        "object": "response",
        "created_at": 0,
        "model": "synthetic",
        "status": "completed",
        "output": [
            {
                "type": "message",
                "id": "msg_bench",
                "role": "assistant",
                "status": "completed",
                "content": [
                    {"type": "output_text", "text": text, "annotations": [], "logprobs": entries}
                ],
            }
        ],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }


def naive_logprobs_frame(response: Any) -> pd.DataFrame:
    """The obvious per-row loop: one dict per token, statistics computed in Python."""
    rows = []
    for oi, item in enumerate(response.output):
        if item.type != "message":
            continue
        for ci, part in enumerate(item.content):
            decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            chars = 0
            byte_offset = 0
            for pos, lp in enumerate(part.logprobs or []):
                raw = bytes(lp.bytes)
                text = decoder.decode(raw)
                alts = sorted(lp.top_logprobs, key=lambda a: -a.logprob)
                rank = next((i + 1 for i, a in enumerate(alts) if a.token == lp.token), None)
                others = [a for a in alts if a.token != lp.token]
                runner = others[0] if others else None
                probs = [math.exp(a.logprob) for a in alts]
                rows.append(
                    {
                        "response_id": response.id,
                        "output_index": oi,
                        "content_index": ci,
                        "position": pos,
                        "token": lp.token,
                        "text": text,
                        "bytes": raw,
                        "byte_offset": byte_offset,
                        "char_offset": chars,
                        "logprob": lp.logprob,
                        "prob": math.exp(lp.logprob),
                        "rank": rank,
                        "runner_up": runner.token if runner else None,
                        "margin": lp.logprob - runner.logprob if runner else math.nan,
                        "topk_entropy": -sum(p * math.log(p) for p in probs if p > 0),
                    }
                )
                chars += len(text)
                byte_offset += len(raw)
    return pd.DataFrame(rows)


def _best_of(rounds: int, fn: Any, *args: Any) -> tuple[float, float, Any]:
    """Best wall and CPU seconds over ``rounds`` calls (CPU time is steadier on a busy box)."""
    wall, cpu, result = math.inf, math.inf, None
    for _ in range(rounds):
        start, start_cpu = time.perf_counter(), time.process_time()
        result = fn(*args)
        wall = min(wall, time.perf_counter() - start)
        cpu = min(cpu, time.process_time() - start_cpu)
    return wall, cpu, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1_000_000)
    parser.add_argument("--top", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    start = time.perf_counter()
    as_dict = synthetic_response(args.tokens, args.top)
    response = construct_type(type_=Response, value=as_dict)  # what the SDK returns
    print(
        f"built {args.tokens:,} tokens x {args.top} alternatives in "
        f"{time.perf_counter() - start:.1f} s"
    )

    t_obj, c_obj, frame = _best_of(args.rounds, logprobs_frame, response)
    t_dict, c_dict, _ = _best_of(args.rounds, logprobs_frame, as_dict)
    with gc_paused():  # spare the baseline the collector pauses logprobs_frame avoids
        t_naive, c_naive, naive = _best_of(1, naive_logprobs_frame, response)

    assert len(frame) == len(naive) == args.tokens
    assert "".join(frame["text"]) == response.output[0].content[0].text
    assert np.allclose(frame["margin"], naive["margin"], equal_nan=True)
    assert np.allclose(frame["topk_entropy"], naive["topk_entropy"])
    assert (frame["rank"].fillna(0).to_numpy() == naive["rank"].fillna(0).to_numpy()).all()
    rows = args.tokens
    for label, wall, cpu in [
        ("Response", t_obj, c_obj),
        ("dict", t_dict, c_dict),
        ("naive", t_naive, c_naive),
    ]:
        print(
            f"logprobs_frame[{label:8}] wall {wall:6.2f} s  cpu {cpu:6.2f} s"
            f"  {rows / wall:11,.0f} rows/s"
        )
    print(
        f"speed-up over naive (wall): {t_naive / t_obj:.1f}x Response, {t_naive / t_dict:.1f}x dict"
    )
    for label, wall in [("Response", t_obj), ("dict", t_dict)]:
        per_million = wall * 1e6 / rows
        verdict = "met" if per_million <= 2 else "MISSED"
        print(f"target <= 2 s per 1M rows, {label}: {verdict} ({per_million:.2f} s)")


if __name__ == "__main__":
    main()
