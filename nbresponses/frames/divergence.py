"""llama.cpp's KL-divergence report, from a per-token comparison of two engines.

``llama-perplexity --kl-divergence`` compares a model (Q) with a base over a corpus and prints
perplexity, KL and token-probability statistics (``tools/perplexity/perplexity.cpp``,
``kl_divergence``). :func:`divergence_summary` computes the same statistics with the same
definitions from a frame with one row per token (``Engine.divergence``'s, built by
:func:`divergence_frame`): ``logprob_<a>`` (the
base's logprob of the scored token), ``logprob_<b>`` (the other's), ``kl`` (KL(a ‖ b) over the
whole vocabulary) and ``argmax_agree``. Differences from llama.cpp: every scored token counts
(llama.cpp scores only the second half of each context-sized chunk), and logprobs are not
quantised to 16 bits first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["PERCENTILES", "divergence_frame", "divergence_summary"]

#: the percentiles llama.cpp prints (fractions)
PERCENTILES = (0.999, 0.99, 0.95, 0.90, 0.75, 0.25, 0.10, 0.05, 0.01, 0.001)


def divergence_frame(
    columns: Mapping[str, Sequence[Any]], *, names: tuple[str, str] = ("a", "b")
) -> pd.DataFrame:
    """The per-token frame of two engines' comparison (``engine.divergence``) from its
    columns: ``document``, ``position``, ``token``, ``logprob_a`` / ``logprob_b``,
    ``rank_a`` / ``rank_b``, ``kl`` and ``argmax_agree``; the ``_a`` / ``_b`` suffixes become
    ``names``, and ``dlogprob`` (b − a) and ``dp`` (p_b − p_a) are added."""
    x, y = names
    out = pd.DataFrame(dict(columns))
    out["document"] = out["document"].astype("int64")
    out["position"] = out["position"].astype("int64")
    out = out.rename(columns={"logprob_a": f"logprob_{x}", "logprob_b": f"logprob_{y}",
                              "rank_a": f"rank_{x}", "rank_b": f"rank_{y}"})  # fmt: skip
    out["dlogprob"] = out[f"logprob_{y}"] - out[f"logprob_{x}"]
    out["dp"] = np.exp(out[f"logprob_{y}"]) - np.exp(out[f"logprob_{x}"])
    order = ["document", "position", "token", f"logprob_{x}", f"logprob_{y}", "dlogprob", "dp"]
    rest = [c for c in out.columns if c not in order]
    return out[order + rest]


def _mean_and_uncertainty(values: np.ndarray) -> tuple[float, float]:
    """llama.cpp's ``mean_and_uncertainty``: the mean and sqrt(var / (n - 1)), with the
    population variance; 0 for 10 values or fewer."""
    n = values.size
    mean = float(values.mean())
    var = float(np.mean(values**2)) - mean * mean
    return mean, (math.sqrt(var / (n - 1)) if var > 0 and n > 10 else 0.0)


def _covariance(a: np.ndarray, b: np.ndarray) -> float:
    """llama.cpp's ``covariance`` of two means: (E[ab] - E[a]E[b]) / (n - 1); 0 below 10."""
    n = a.size
    if n < 10:
        return 0.0
    return (float(np.mean(a * b)) - float(a.mean()) * float(b.mean())) / (n - 1)


def divergence_summary(frame: pd.DataFrame, *, names: tuple[str, str] = ("a", "b")) -> pd.Series:
    """llama.cpp's KL-divergence statistics over every token of ``frame`` (``a`` the base,
    ``b`` the model compared with it; Q in llama.cpp's output).

    ``ppl_<a>``, ``ppl_<b>`` (exp of the mean negative logprob) with their uncertainties
    (``ppl × stderr of the mean``), ``cor_ln_ppl`` (correlation of the two mean negative
    logprobs), ``ln_ppl_ratio`` = ln(PPL(b)/PPL(a)) and ``ppl_ratio`` with uncertainties from
    the two stderrs and their covariance, ``ppl_diff``; ``kld_mean`` ± ``kld_mean_unc``,
    ``kld_max``, ``kld_p99.9`` … ``kld_p0.1``, ``kld_median``, ``kld_min``; ``dp_mean`` ±
    (Δp = p_b − p_a of the scored token, as a fraction, not %), its percentiles, ``dp_rms`` ±
    ``dp_rms_unc``; ``same_top1`` ± (the fraction of tokens whose most likely next token is the
    same). Percentiles interpolate linearly between sorted values, as llama.cpp's do.
    """
    a, b = names
    need = {f"logprob_{a}", f"logprob_{b}", "kl", "argmax_agree"}
    if need - set(frame.columns):
        raise ValueError(f"the frame lacks {sorted(need - set(frame.columns))}")
    nll_a = -frame[f"logprob_{a}"].to_numpy(dtype=np.float64)
    nll_b = -frame[f"logprob_{b}"].to_numpy(dtype=np.float64)
    kld = frame["kl"].to_numpy(dtype=np.float64)
    dp = np.exp(-nll_b) - np.exp(-nll_a)
    same = frame["argmax_agree"].to_numpy(dtype=bool)
    n = nll_a.size
    if n < 2:
        raise ValueError("a summary needs at least 2 tokens")
    out: dict[str, float] = {"n": float(n)}
    ln_a, ln_a_unc = _mean_and_uncertainty(nll_a)
    ln_b, ln_b_unc = _mean_and_uncertainty(nll_b)
    ppl_a, ppl_b = math.exp(ln_a), math.exp(ln_b)
    out[f"ppl_{a}"], out[f"ppl_{a}_unc"] = ppl_a, ppl_a * ln_a_unc
    out[f"ppl_{b}"], out[f"ppl_{b}_unc"] = ppl_b, ppl_b * ln_b_unc
    cov = _covariance(nll_b, nll_a)
    denominator = ln_a_unc * ln_b_unc
    out["cor_ln_ppl"] = cov / denominator if denominator > 0 else float("nan")
    ratio_unc = math.sqrt(max(ln_b_unc**2 + ln_a_unc**2 - 2.0 * cov, 0.0))
    out["ln_ppl_ratio"], out["ln_ppl_ratio_unc"] = ln_b - ln_a, ratio_unc
    ratio = math.exp(ln_b - ln_a)
    out["ppl_ratio"], out["ppl_ratio_unc"] = ratio, ratio * ratio_unc
    ppl_cov = ppl_b * ppl_a * cov
    diff_var = (ppl_b * ln_b_unc) ** 2 + (ppl_a * ln_a_unc) ** 2 - 2.0 * ppl_cov
    out["ppl_diff"], out["ppl_diff_unc"] = ppl_b - ppl_a, math.sqrt(max(diff_var, 0.0))
    out["kld_mean"], out["kld_mean_unc"] = _mean_and_uncertainty(kld)
    _percentiles(out, "kld", kld)
    out["dp_mean"], out["dp_mean_unc"] = _mean_and_uncertainty(dp)
    _percentiles(out, "dp", dp)
    mse, mse_unc = _mean_and_uncertainty(dp**2)
    rms = math.sqrt(mse)
    out["dp_rms"], out["dp_rms_unc"] = rms, (0.5 / rms * mse_unc if rms > 0 else 0.0)
    top = float(same.mean())
    out["same_top1"], out["same_top1_unc"] = top, math.sqrt(top * (1.0 - top) / (n - 1))
    return pd.Series(out, dtype=np.float64)


def _percentiles(out: dict[str, float], name: str, values: np.ndarray) -> None:
    out[f"{name}_max"] = float(values.max())
    for fraction in PERCENTILES:
        out[f"{name}_p{100 * fraction:g}"] = float(np.quantile(values, fraction))
    out[f"{name}_median"] = float(np.median(values))
    out[f"{name}_min"] = float(values.min())
