"""Two engines on the same tokens, compared over the whole vocabulary, streaming.

Both engines (two recipes of one model, or two models with one tokenizer) score the same token
ids; at every position the two full next-token distributions give the exact KL(a ‖ b), the
scored token's probability under each (Δp), both its ranks and whether the most likely token
agrees. Texts are scored in chunks of ``chunk`` tokens, by one engine and then the other, and
each chunk's distributions are reduced to those few numbers before the next chunk is asked
for: memory stays at two chunks of vocabulary-sized vectors, whatever the corpus
(llama.cpp's tool writes every position's logits to a file first). The prefix cache keeps a
chunk's context from being recomputed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from nbresponses.frames.divergence import divergence_frame
from nbresponses.service.scoring import DEFAULT_METHOD, Method, Scoring, windows
from nbresponses.tokens.contract import TokenIdLogprob

from .backend import ScoringBackend

__all__ = ["divergence", "token_divergence"]


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


def _add_rows(
    rows: dict[str, list[Any]],
    backend: ScoringBackend,
    a: list[TokenIdLogprob],
    b: list[TokenIdLogprob],
) -> None:
    """Each token's numbers; the distributions themselves are not kept."""
    for la, lb in zip(a, b, strict=True):
        if la.distribution.shape != lb.distribution.shape:
            raise ValueError(
                f"vocabularies differ ({la.distribution.shape[0]} vs {lb.distribution.shape[0]}"
                " tokens): compare engines with the same tokenizer"
            )
        kl, rank_a, rank_b, same = token_divergence(la.distribution, lb.distribution, la.token_id)
        rows["token"].append(backend.token_text(la))
        rows["logprob_a"].append(la.logprob)
        rows["logprob_b"].append(lb.logprob)
        rows["rank_a"].append(rank_a)
        rows["rank_b"].append(rank_b)
        rows["kl"].append(kl)
        rows["argmax_agree"].append(same)


async def divergence(
    a: ScoringBackend,
    b: ScoringBackend,
    texts: Iterable[str],
    *,
    names: tuple[str, str] = ("a", "b"),
    method: Method = DEFAULT_METHOD,
    chunk: int = 256,
    progress: bool = True,
) -> pd.DataFrame:
    """One row per scored token of every text (plain text after an end-of-text token, as
    ``score`` does): ``document``, ``position``, ``token``, ``logprob_<a>`` / ``logprob_<b>``,
    ``dlogprob``, ``dp`` (p_b − p_a of the token), ``rank_<a>`` / ``rank_<b>`` (exact, over the
    vocabulary), ``kl`` = KL(a ‖ b) over the whole vocabulary (nats) and ``argmax_agree``
    (``frames.divergence.divergence_frame``). ``nbr.divergence_summary`` turns it into
    llama.cpp's report."""
    if chunk < 1:
        raise ValueError("chunk must be >= 1")
    items: Sequence[str] = texts if isinstance(texts, Sequence) else list(texts)
    columns = ["document", "position", "token", "logprob_a", "logprob_b", "rank_a", "rank_b"]
    rows: dict[str, list[Any]] = {k: [] for k in [*columns, "kl", "argmax_agree"]}
    bar = tqdm(total=len(items), unit="text", desc="comparing", disable=not progress)
    try:
        for document, text in enumerate(items):
            ids = await a.tokenize(text)
            if ids != await b.tokenize(text):
                raise ValueError(
                    f"text {document} tokenizes differently on the two engines: compare "
                    "engines with the same tokenizer"
                )
            if not ids:
                continue
            job = Scoring([a.document_start()], ids)
            position = 0
            for context, given in windows(job, a.context_length):
                for start in range(0, len(given), chunk):
                    ctx, part = [*context, *given[:start]], given[start : start + chunk]
                    # one engine after the other: both run in this kernel, on the same cores,
                    # and side by side their thread pools took turns on them (2,940 tokens,
                    # 2 cores: 257-296 against 311-328 tokens/s, benchmarks/README.md)
                    da = await a.distributions(ctx, part, method)
                    db = await b.distributions(ctx, part, method)
                    _add_rows(rows, a, da, db)
                    del da, db  # the distributions go: only the per-token numbers stay
                    rows["document"].extend([document] * len(part))
                    rows["position"].extend(range(position, position + len(part)))
                    position += len(part)
            bar.update(1)
    finally:
        bar.close()
    if not rows["token"]:
        raise ValueError("no tokens to compare")
    return divergence_frame(rows, names=names)
