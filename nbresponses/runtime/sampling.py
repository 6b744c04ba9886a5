"""Token choice and logprobs for one request's row of logits.

Logprobs are those of the model's own distribution: a float32 log-softmax over the full
vocabulary of the raw logits, *before* ``logit_bias``, temperature, top-k or top-p. This is what
OpenAI reports, and it keeps logprobs comparable across sampling settings. Sampling draws from
the tempered, filtered distribution with the request's own numpy Generator, so a seed gives the
same tokens whether the request runs alone or batched (one uniform draw per token, nothing
shared between rows). On request (``SamplingParams.processed_logprobs``, vLLM's
``logprobs_mode="processed_logprobs"``) each token also gets its logprob under the distribution
it was drawn from, computed from the very support the draw used. ``logit_bias`` (OpenAI's) is
added to a row's own logits before its choice, greedy included (``biased``): it reshapes the
distribution drawn from, never the reported logprobs, and no other row's.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

from nbresponses.tokens.contract import SamplingParams, TokenIdLogprob

if TYPE_CHECKING:
    from nbresponses.models.kernels import RowStats

MAX_TOP_LOGPROBS = 20


class NativeStats(Protocol):
    """A compiled ``token_logprob`` core, as ``models.kernels.TokenStats``: (row, token,
    log-softmax out or None) -> (logprob, rank, entropy), and a log-softmax's top k."""

    def __call__(
        self, logits: np.ndarray, token: int, logp: np.ndarray | None = None
    ) -> tuple[float, int, float]: ...

    def top(self, logp: np.ndarray, k: int) -> tuple[tuple[int, float], ...]: ...

    def rows(
        self,
        logits: np.ndarray,
        tokens: Sequence[int],
        k: int = 0,
        logp: np.ndarray | None = None,
        threads: int = 1,
    ) -> RowStats: ...


_NUCLEUS_PROBE = 64  # top-p: first try the 64 most likely tokens before sorting the vocabulary


def validate(params: SamplingParams) -> None:
    """Raise ValueError for settings no request may run with."""
    if params.max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {params.max_tokens}")
    if not params.temperature >= 0 or not np.isfinite(params.temperature):
        raise ValueError(f"temperature must be a finite number >= 0, got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {params.top_p}")
    if params.top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {params.top_k}")
    if params.forced_tokens and params.max_tokens != len(params.forced_tokens):
        raise ValueError(
            f"max_tokens ({params.max_tokens}) must equal the number of forced tokens "
            f"({len(params.forced_tokens)})"
        )
    if params.seed is not None and (
        isinstance(params.seed, bool) or not isinstance(params.seed, int | np.integer)
    ):
        raise ValueError(f"seed must be an integer or None, got {params.seed!r}")
    if not 0 <= params.top_logprobs <= MAX_TOP_LOGPROBS:
        raise ValueError(
            f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {params.top_logprobs}"
        )
    for token, bias in (params.logit_bias or {}).items():
        if isinstance(token, bool) or not isinstance(token, int | np.integer) or token < 0:
            raise ValueError(f"logit_bias keys must be token ids (integers >= 0), got {token!r}")
        if (
            isinstance(bias, bool)
            or not isinstance(bias, int | float | np.integer | np.floating)
            or not np.isfinite(bias)
        ):
            raise ValueError(f"logit_bias of token {token} must be a finite number, got {bias!r}")


Bias = tuple[np.ndarray, np.ndarray]  # token ids (int64) and what to add to their logits (float32)


def bias_of(params: SamplingParams) -> Bias | None:
    """A request's ``logit_bias`` as arrays, once per request (None: nothing to add)."""
    items = [(int(t), float(b)) for t, b in (params.logit_bias or {}).items() if b != 0]
    if not items:
        return None
    ids, values = zip(*sorted(items), strict=True)
    return np.asarray(ids, np.int64), np.asarray(values, np.float32)


def biased(logits: np.ndarray, bias: Bias) -> np.ndarray:
    """A copy of a row's logits with the bias added (float32, as vLLM adds it): what the
    token is chosen from. The row's own logits are left as they are, for its logprobs."""
    ids, values = bias
    if ids[-1] >= logits.shape[-1]:
        raise ValueError(
            f"logit_bias names token {int(ids[-1])}, outside the vocabulary [0, {logits.shape[-1]})"
        )
    out = logits.astype(np.float32, copy=True)
    out[ids] += values
    return out


def make_rng(params: SamplingParams) -> np.random.Generator:
    """The request's own generator. A seed is any int64 (vLLM's range); a negative one is read
    as its two's complement, so every seed names one stream and non-negative seeds keep
    numpy's own meaning. No seed: fresh OS entropy."""
    return np.random.default_rng(None if params.seed is None else params.seed % 2**64)


def derived_seeds(seed: int, n: int) -> list[int]:
    """The seeds of ``n`` completions drawn with one ``seed`` (``Engine.sample``): the first
    ``n`` 64-bit words of ``numpy.random.SeedSequence(seed mod 2**64)``, shifted right by one
    bit (each a valid int64 seed, 0 <= s < 2**63). Independent streams, none equal to ``seed``
    itself or to those of a neighbouring seed; the first ``k`` of ``n`` are those of ``k``."""
    if n < 1:
        return []
    words = np.random.SeedSequence(seed % 2**64).generate_state(n, np.uint64)
    return [int(w) >> 1 for w in words]


def fresh_seed() -> int:
    """A seed from OS entropy (0 <= s < 2**63), for a sample that was given none: drawn once,
    so every completion's seed is known and can be replayed."""
    return int(np.random.SeedSequence().generate_state(1, np.uint64)[0]) >> 1


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Full-vocabulary log-softmax in float32 (the sum is accumulated in float64)."""
    x = logits.astype(np.float32, copy=False)
    shifted = x - x.max()
    lse = np.log(np.exp(shifted, dtype=np.float64).sum())
    return (shifted - np.float32(lse)).astype(np.float32, copy=False)


def choose(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """Pick the next token: argmax when greedy, else a draw after temperature, top-k, top-p."""
    if params.temperature == 0:
        return int(np.argmax(logits))
    ids, cdf, _ = _support(logits, params)
    pick = _draw(cdf, rng)
    return int(pick if ids is None else ids[pick])


def _support(
    logits: np.ndarray, params: SamplingParams
) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """What a sampled draw chooses among: the token ids (None: the whole vocabulary in id
    order), the cumulative weights the draw reads (unnormalised), and each token's log weight
    (tempered logit minus the peak). Shared by ``choose`` and ``processed_logprob``, so the
    processed distribution is exactly the one drawn from."""
    x = logits.astype(np.float64) / (params.temperature or 1.0)
    vocab = x.shape[0]
    pool: np.ndarray | None = None  # top-k survivors (None: the whole vocabulary)
    if 0 < params.top_k < vocab:
        pool = np.sort(np.argpartition(-x, params.top_k - 1)[: params.top_k])
    values = x if pool is None else x[pool]
    peak = values.max()
    if params.top_p >= 1.0:
        logw = values - peak
        return pool, np.cumsum(np.exp(logw)), logw
    # Nucleus over the pool, renormalised; sort only as much of it as the nucleus needs.
    total = np.exp(values - peak).sum()
    head = top_k(values, _NUCLEUS_PROBE)
    cum = np.cumsum(np.exp(values[head] - peak)) / total
    if cum[-1] < params.top_p and head.shape[0] < values.shape[0]:
        head = top_k(values, values.shape[0])
        cum = np.cumsum(np.exp(values[head] - peak)) / total
    keep = min(int(np.searchsorted(cum, params.top_p, side="left")) + 1, head.shape[0])
    kept = head[:keep]
    return (kept if pool is None else pool[kept]), cum[:keep], values[kept] - peak


def processes(params: SamplingParams, masked: bool = False) -> bool:
    """Whether the distribution a token is drawn from differs from the model's own: a grammar
    (``masked``: the logits were masked or biased), or, when sampling, a temperature other
    than 1, top-k or top-p (a greedy request's is the model's own distribution, as in vLLM;
    its argmax is the token)."""
    if masked or any(b != 0 for b in (params.logit_bias or {}).values()):
        return True
    if params.temperature == 0:
        return False
    return params.temperature != 1.0 or params.top_p < 1 or params.top_k > 0


def processed_logprob(logits: np.ndarray, token_id: int, params: SamplingParams) -> float:
    """The token's logprob under the distribution a draw picks from (vLLM's
    ``processed_logprobs``): the logits as the choice saw them (biased, masked by a grammar)
    divided by the temperature, cut to top-k and the top-p nucleus, renormalised. A greedy
    request's is that (biased, masked) distribution itself, as in vLLM: its argmax is the
    token. A token outside the kept set (only a forced one can be) gets -inf."""
    if params.temperature == 0:
        params = dataclasses.replace(params, temperature=1.0, top_p=1.0, top_k=0)
    ids, _, logw = _support(logits, params)
    if ids is None:
        where = int(token_id)
    else:
        found = np.flatnonzero(ids == token_id)
        if not found.size:
            return float("-inf")
        where = int(found[0])
    if not np.isfinite(logw[where]):
        return float("-inf")
    return float(logw[where] - np.log(np.exp(logw).sum()))


def _draw(cdf: np.ndarray, rng: np.random.Generator) -> int:
    """Inverse-CDF draw from an unnormalised cumulative distribution (one uniform per token)."""
    pick = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return min(pick, cdf.shape[0] - 1)


class _Scratch(threading.local):
    """Per-thread work buffers for ``token_logprob``: a row's log-softmax needs a float32 and
    a float64 vector of the vocabulary's size, and fresh ones cost a page fault per 4 KiB
    (a 16-row step with logprobs spent more time faulting than computing)."""

    def __init__(self) -> None:
        self.f32 = np.empty(0, np.float32)
        self.f64 = np.empty(0, np.float64)
        self.block = np.empty(0, np.float32)  # ``token_logprobs``' rows

    def get(self, size: int) -> tuple[np.ndarray, np.ndarray]:
        if self.f32.shape[0] != size:
            self.f32 = np.empty(size, np.float32)
            self.f64 = np.empty(size, np.float64)
        return self.f32, self.f64

    def rows(self, shape: tuple[int, int]) -> np.ndarray:
        """A float32 [rows, vocab] buffer over memory reused (grown, never shrunk)."""
        if self.block.size < shape[0] * shape[1]:
            self.block = np.empty(shape[0] * shape[1], np.float32)
        return self.block[: shape[0] * shape[1]].reshape(shape)


_scratch = _Scratch()
_BLOCK = 64  # top-k: a bound from the maxima of blocks of this many values
_ROWS_AT_ONCE = 32  # rows a call of ``token_logprobs`` writes log-softmaxes of


def top_k(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values, largest first, ties broken by lower index (so the
    choice among equal values never depends on a selection algorithm's internals), NaNs left
    out (a log-softmax with one is NaN throughout: no alternatives).

    Exact and faster than a partition of the vocabulary: the k-th largest group maximum is
    a lower bound of the k-th largest value (those k maxima are k values at least that
    large), so every top-k value is among the few at or above it. The groups are strided
    (``_BLOCK`` rows of a [_BLOCK, n / _BLOCK] view, reduced over the rows): one elementwise
    pass, ~15x faster than reducing each contiguous block, and any partition gives the bound."""
    n = values.shape[0]
    k = min(k, n)
    if k <= 0:
        return np.empty(0, np.int64)
    whole = n - n % _BLOCK
    bounds = values[:whole].reshape(_BLOCK, -1).max(axis=0) if whole else values[:0]
    bounds = np.concatenate([bounds, values[whole:]])
    if bounds.shape[0] > k:
        floor = np.partition(bounds, bounds.shape[0] - k)[bounds.shape[0] - k]
        candidates = np.flatnonzero(values >= floor)
    else:
        candidates = np.flatnonzero(values == values)  # NaNs are no one's alternatives
    order = np.lexsort((candidates, -values[candidates]))[:k]
    return candidates[order]


def token_logprobs(
    logits: np.ndarray,
    token_ids: Sequence[int],
    top: int | Sequence[int],
    *,
    details: bool | Sequence[bool] = False,
    distribution: bool | Sequence[bool] = False,
    native: NativeStats | None = None,
    threads: int = 1,
) -> tuple[TokenIdLogprob, ...]:
    """``token_logprob`` of each row of ``logits`` [R, vocab] with its token, the same numbers;
    ``top``, ``details`` and ``distribution`` for all rows or one a row (a step's requests ask
    for different ones). With ``native``, the rows in few calls on up to ``threads``
    threads (a scoring run's positions, a step's rows: independent rows while both cores wait
    for the next run); a row's top k is the first k of the most any row asks for (the same
    order)."""
    count = len(token_ids)
    if len(logits) != count:
        raise ValueError(f"one token a row: {len(logits)} rows, {count} tokens")
    tops = [top] * count if isinstance(top, int) else list(top)
    detailed = [details] * count if isinstance(details, bool) else list(details)
    whole = [distribution] * count if isinstance(distribution, bool) else list(distribution)
    if native is None:
        return tuple(
            token_logprob(row, token, k, details=d, distribution=w)
            for row, token, k, d, w in zip(logits, token_ids, tops, detailed, whole, strict=True)
        )
    rows = logits if logits.dtype == np.float32 else logits.astype(np.float32)
    if rows.strides[1] != rows.itemsize:
        rows = np.ascontiguousarray(rows)
    most = max(tops, default=0)
    kept = most > 0 or any(whole)  # the log-softmaxes are needed: for the top k, or copied out
    # then in blocks of rows, in a reused buffer of _ROWS_AT_ONCE rows (not a run's 256: 155 MB
    # at Qwen3's vocabulary); else all rows in one call
    size = _ROWS_AT_ONCE if kept else max(1, count)
    out: list[TokenIdLogprob] = []
    for first in range(0, count, size):
        block = slice(first, min(count, first + size))
        logp = _scratch.rows((block.stop - block.start, rows.shape[1])) if kept else None
        found = native.rows(rows[block], token_ids[block], most, logp, threads)
        values, ranks = found.logprob.tolist(), found.rank.tolist()
        entropies, counts = found.entropy.tolist(), found.counts.tolist()
        ids, best = found.ids.tolist(), found.values.tolist()
        for n, r in enumerate(range(block.start, block.stop)):
            shown = min(tops[r], counts[n])
            out.append(
                TokenIdLogprob(
                    token_id=int(token_ids[r]),
                    logprob=values[n],
                    top=tuple(zip(ids[n][:shown], best[n][:shown], strict=True)),
                    rank=ranks[n] if detailed[r] else None,
                    entropy=entropies[n] if detailed[r] else None,
                    distribution=logp[n].copy() if whole[r] and logp is not None else None,
                )
            )
    return tuple(out)


def token_logprob(
    logits: np.ndarray,
    token_id: int,
    top: int,
    *,
    details: bool = False,
    distribution: bool = False,
    native: NativeStats | None = None,
) -> TokenIdLogprob:
    """The chosen token's logprob and the ``top`` best alternatives, from the raw logits; with
    ``details``, its rank (1 + the number of tokens more likely) and the entropy in nats; with
    ``distribution``, a copy of the whole log-softmax (the same float32 values).

    The same float32 values as ``log_softmax`` (tests/runtime/test_units.py compares them
    bit for bit), computed in reused buffers. The entropy reuses the softmax's one exp pass,
    -sum(exp(shifted) * logp) / sum(exp(shifted)) in float64: the exp of the vocabulary is
    most of this function's time, and this form is also ~5x closer to a float64 computation
    than the exp of the rounded float32 logprobs was (tests/runtime/test_units.py).

    ``native``: the same numbers from compiled code (``models.kernels.TokenStats``, ~3x faster;
    the engine uses it for the models that use our operators, so a model's logprobs always come
    from one of the two)."""
    x = logits.astype(np.float32, copy=False)
    logp, wide = _scratch.get(x.shape[0])
    if native is not None:
        whole = top > 0 or distribution
        value, place, spread = native(x, int(token_id), logp if whole else None)
        return TokenIdLogprob(
            token_id=int(token_id),
            logprob=value,
            top=native.top(logp, top) if top > 0 else (),
            rank=place if details else None,
            entropy=spread if details else None,
            distribution=logp.copy() if distribution else None,
        )
    np.subtract(x, x.max(), out=logp)  # shifted
    np.exp(logp, out=wide, dtype=np.float64)
    total = wide.sum()
    np.subtract(logp, np.float32(np.log(total)), out=logp)
    alternatives: tuple[tuple[int, float], ...] = ()
    if top > 0:
        alternatives = tuple((int(i), float(logp[i])) for i in top_k(logp, top))
    rank = entropy = None
    if details:
        rank = 1 + int(np.count_nonzero(logp > logp[token_id]))
        entropy = float(-np.multiply(wide, logp, out=wide).sum() / total)
    return TokenIdLogprob(
        token_id=int(token_id),
        logprob=float(logp[token_id]),
        top=alternatives,
        rank=rank,
        entropy=entropy,
        distribution=logp.copy() if distribution else None,
    )
