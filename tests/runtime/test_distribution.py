"""A token's full log-softmax, handed over on request (SamplingParams.distribution)."""

from __future__ import annotations

import numpy as np
import torch

from nbresponses.runtime import sampling


def test_distribution_is_the_log_softmax_and_a_copy() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 4, 5000).astype(np.float32)
    first = sampling.token_logprob(logits, 7, 3, details=True, distribution=True)
    expected = torch.log_softmax(torch.from_numpy(logits).double(), -1).numpy()
    assert first.distribution.dtype == np.float32 and first.distribution.shape == (5000,)
    np.testing.assert_allclose(first.distribution, expected, rtol=0, atol=2e-6)
    assert first.distribution[7] == np.float32(first.logprob)  # the same floats as the logprob
    kept = first.distribution.copy()
    other = rng.normal(0, 4, 5000).astype(np.float32)
    sampling.token_logprob(other, 1, 3, distribution=True)  # reuses the scratch buffers
    assert np.array_equal(first.distribution, kept)  # ours was a copy
    assert sampling.token_logprob(logits, 7, 3).distribution is None
    assert sampling.token_logprob(logits, 7, 3).logprob == first.logprob
