"""llama.cpp's KL-divergence statistics, checked against its own running-sum formulas written
out here in plain Python (as in tools/perplexity/perplexity.cpp)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from nbresponses.frames import divergence_summary


def _llama_mean_unc(values: list[float]) -> tuple[float, float]:
    s = sum(values)
    s2 = sum(v * v for v in values)
    n = len(values)
    f = s / n
    df = s2 / n - f * f
    return f, (math.sqrt(df / (n - 1)) if df > 0 and n > 10 else 0.0)


def _llama_percentile(values: list[float], fraction: float) -> float:
    v = sorted(values)
    p = fraction * (len(v) - 1)
    ip = int(p)
    p -= ip
    return (1 - p) * v[ip] + p * v[min(ip + 1, len(v) - 1)]


def _frame(n: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    base = np.log(rng.uniform(0.01, 1.0, n))
    other = np.minimum(base + rng.normal(0, 0.3, n), 0.0)
    return pd.DataFrame(
        {
            "logprob_a": base,
            "logprob_b": other,
            "kl": rng.exponential(0.05, n),
            "argmax_agree": rng.uniform(size=n) < 0.9,
        }
    )


def test_summary_matches_llama_cpp_definitions() -> None:
    frame = _frame(500)
    got = divergence_summary(frame)
    nll = [-v for v in frame.logprob_b]  # Q, the compared model
    nll_base = [-v for v in frame.logprob_a]
    ln_q, ln_q_unc = _llama_mean_unc(nll)
    ln_b, ln_b_unc = _llama_mean_unc(nll_base)
    n = len(nll)
    cov = (sum(x * y for x, y in zip(nll, nll_base, strict=True)) / n - ln_q * ln_b) / (n - 1)
    assert got["ppl_b"] == pytest.approx(math.exp(ln_q))
    assert got["ppl_b_unc"] == pytest.approx(math.exp(ln_q) * ln_q_unc)
    assert got["ppl_a"] == pytest.approx(math.exp(ln_b))
    assert got["cor_ln_ppl"] == pytest.approx(cov / (ln_q_unc * ln_b_unc))
    ratio_unc = math.sqrt(ln_q_unc**2 + ln_b_unc**2 - 2 * cov)
    assert got["ln_ppl_ratio"] == pytest.approx(ln_q - ln_b)
    assert got["ln_ppl_ratio_unc"] == pytest.approx(ratio_unc)
    assert got["ppl_ratio"] == pytest.approx(math.exp(ln_q - ln_b))
    assert got["ppl_ratio_unc"] == pytest.approx(math.exp(ln_q - ln_b) * ratio_unc)
    kld = list(frame.kl)
    mean, unc = _llama_mean_unc(kld)
    assert (got["kld_mean"], got["kld_mean_unc"]) == pytest.approx((mean, unc))
    assert got["kld_max"] == max(kld) and got["kld_min"] == min(kld)
    for fraction, key in [(0.999, "kld_p99.9"), (0.99, "kld_p99"), (0.9, "kld_p90")]:
        assert got[key] == pytest.approx(_llama_percentile(kld, fraction))
    assert got["kld_median"] == pytest.approx(_llama_percentile(kld, 0.5))
    dp = [math.exp(-q) - math.exp(-b) for q, b in zip(nll, nll_base, strict=True)]
    assert (got["dp_mean"], got["dp_mean_unc"]) == pytest.approx(_llama_mean_unc(dp))
    assert got["dp_p1"] == pytest.approx(_llama_percentile(dp, 0.01))
    mse, mse_unc = _llama_mean_unc([d * d for d in dp])
    assert got["dp_rms"] == pytest.approx(math.sqrt(mse))
    assert got["dp_rms_unc"] == pytest.approx(0.5 / math.sqrt(mse) * mse_unc)
    top = float(frame.argmax_agree.mean())
    assert got["same_top1"] == pytest.approx(top)
    assert got["same_top1_unc"] == pytest.approx(math.sqrt(top * (1 - top) / (n - 1)))
    assert got["n"] == 500


def test_identical_engines_and_small_samples() -> None:
    frame = _frame(8)
    frame["logprob_b"] = frame["logprob_a"]
    frame["kl"] = 0.0
    frame["argmax_agree"] = True
    got = divergence_summary(frame)
    assert got["ppl_ratio"] == 1.0 and got["kld_mean"] == 0.0 and got["dp_rms"] == 0.0
    assert got["ppl_a_unc"] == 0.0  # llama.cpp gives no uncertainty for 10 tokens or fewer
    assert got["same_top1"] == 1.0 and got["same_top1_unc"] == 0.0
    with pytest.raises(ValueError, match="lacks"):
        divergence_summary(frame.drop(columns="kl"))
    named = frame.rename(columns={"logprob_a": "logprob_fp32", "logprob_b": "logprob_q8"})
    assert "ppl_q8" in divergence_summary(named, names=("fp32", "q8"))
