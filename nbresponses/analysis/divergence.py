"""Two engines on the same tokens, compared over the whole vocabulary, streaming.

Both engines (two recipes of one model, or two models with one tokenizer) score the same token
ids; at every position the two full next-token distributions give the exact KL(a ‖ b), the
scored token's probability under each (Δp), both its ranks and whether the most likely token
agrees. Texts are scored in chunks of ``chunk`` tokens, the two engines side by side, and
each chunk's distributions are reduced to those few numbers before the next chunk is asked
for: memory stays at two chunks of vocabulary-sized vectors, whatever the corpus
(llama.cpp's tool writes every position's logits to a file first). The prefix cache keeps a
chunk's context from being recomputed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from nbresponses.tokens.contract import TokenIdLogprob

from .scoring import Method, Scorer, Scoring

__all__ = ["compare_engines", "token_divergence"]


def token_divergence(
    log_p: np.ndarray, log_q: np.ndarray, token: int
) -> tuple[float, int, int, bool]:
    """KL(p ‖ q) = Σ p (log p − log q) over the vocabulary (float64), the token's rank under
    each (1 = most likely) and whether both put the same token first."""
    p = np.exp(log_p, dtype=np.float64)
    with np.errstate(invalid="ignore"):  # −inf − −inf where neither has mass
        diff = np.subtract(log_p, log_q, dtype=np.float64)
        kl = float(np.dot(p, diff))
        if not np.isfinite(kl):  # tokens without mass under p add nothing, whatever q says
            kl = float(np.sum((p * diff)[p > 0]))
    rank_p = 1 + int(np.count_nonzero(log_p > log_p[token]))
    rank_q = 1 + int(np.count_nonzero(log_q > log_q[token]))
    return kl, rank_p, rank_q, int(np.argmax(log_p)) == int(np.argmax(log_q))


async def _distributions(
    scorer: Scorer, context: list[int], given: list[int], method: Method
) -> list[TokenIdLogprob]:
    out: list[TokenIdLogprob] = []
    steps = scorer._steps(context, given, 0, method, True)
    async for step in steps:
        if step.finish_reason in ("error", "cancelled"):
            raise RuntimeError(f"scoring ended: {step.error or step.finish_reason}")
        out.extend(step.logprobs or ())
    if len(out) != len(given) or any(lp.distribution is None for lp in out):
        raise ValueError(
            f"{type(scorer.source).__name__} did not give the full distributions of "
            f"{len(given)} tokens"
        )
    return out


def _rows(
    scorer: Scorer,
    a: list[TokenIdLogprob],
    b: list[TokenIdLogprob],
    names: tuple[str, str],
) -> dict[str, list[Any]]:
    x, y = names
    columns = ["token", f"logprob_{x}", f"logprob_{y}", f"rank_{x}", f"rank_{y}", "kl"]
    rows: dict[str, list[Any]] = {k: [] for k in [*columns, "argmax_agree"]}
    for la, lb in zip(a, b, strict=True):
        if la.distribution.shape != lb.distribution.shape:
            raise ValueError(
                f"vocabularies differ ({la.distribution.shape[0]} vs {lb.distribution.shape[0]}"
                " tokens): compare engines with the same tokenizer"
            )
        kl, rank_a, rank_b, same = token_divergence(la.distribution, lb.distribution, la.token_id)
        rows["token"].append(scorer.family.token_logprob(la).token)
        rows[f"logprob_{x}"].append(la.logprob)
        rows[f"logprob_{y}"].append(lb.logprob)
        rows[f"rank_{x}"].append(rank_a)
        rows[f"rank_{y}"].append(rank_b)
        rows["kl"].append(kl)
        rows["argmax_agree"].append(same)
    return rows


async def compare_engines(
    a: Scorer,
    b: Scorer,
    texts: Iterable[str],
    *,
    names: tuple[str, str] = ("a", "b"),
    method: Method = "prefill",
    chunk: int = 256,
    progress: bool = True,
) -> pd.DataFrame:
    """One row per scored token of every text (plain text after an end-of-text token, as
    ``score`` does): ``document``, ``position``, ``token``, ``logprob_<a>`` / ``logprob_<b>``,
    ``dlogprob``, ``dp`` (p_b − p_a of the token), ``rank_<a>`` / ``rank_<b>`` (exact, over the
    vocabulary), ``kl`` = KL(a ‖ b) over the whole vocabulary (nats) and ``argmax_agree``.
    ``nbr.divergence_summary`` turns it into llama.cpp's report."""
    if chunk < 1:
        raise ValueError("chunk must be >= 1")
    from tqdm.auto import tqdm

    items: Sequence[str] = texts if isinstance(texts, Sequence) else list(texts)
    x, y = names
    frames = []
    bar = tqdm(total=len(items), unit="text", desc="comparing", disable=not progress)
    try:
        for document, text in enumerate(items):
            ids = a.family.encode(text)
            if ids != b.family.encode(text):
                raise ValueError(
                    f"text {document} tokenizes differently on the two engines: compare "
                    "engines with the same tokenizer"
                )
            if not ids:
                continue
            job = Scoring([a._document_start()], ids)
            position = 0
            for context, given in a._windows(job):
                for start in range(0, len(given), chunk):
                    ctx, part = [*context, *given[:start]], given[start : start + chunk]
                    da, db = await asyncio.gather(
                        _distributions(a, ctx, part, method), _distributions(b, ctx, part, method)
                    )
                    rows = _rows(a, da, db, names)
                    del da, db  # the distributions go: only the per-token numbers stay
                    frame = pd.DataFrame(rows)
                    frame.insert(0, "position", np.arange(position, position + len(part)))
                    frame.insert(0, "document", document)
                    position += len(part)
                    frames.append(frame)
            bar.update(1)
    finally:
        bar.close()
    if not frames:
        raise ValueError("no tokens to compare")
    out = pd.concat(frames, ignore_index=True)
    out["dlogprob"] = out[f"logprob_{y}"] - out[f"logprob_{x}"]
    out["dp"] = np.exp(out[f"logprob_{y}"]) - np.exp(out[f"logprob_{x}"])
    order = ["document", "position", "token", f"logprob_{x}", f"logprob_{y}", "dlogprob", "dp"]
    rest = [c for c in out.columns if c not in order]
    return out[order + rest]
