"""One token's divergence between two distributions: KL, both ranks and the argmax, against
torch's ``kl_div``."""

from __future__ import annotations

import numpy as np
import torch

from nbresponses.analysis.divergence import token_divergence


def test_token_divergence_against_torch_kl_div() -> None:
    rng = np.random.default_rng(1)
    p = torch.log_softmax(torch.from_numpy(rng.normal(0, 3, 4000)), -1)
    q = torch.log_softmax(p + torch.from_numpy(rng.normal(0, 0.3, 4000)), -1)
    p[:5] = -torch.inf  # tokens p gives no mass: they add nothing
    p = torch.log_softmax(p, -1)
    kl, rank_p, rank_q, same = token_divergence(p.float().numpy(), q.float().numpy(), 9)
    # torch gives 0 · (−inf) = nan for the massless tokens: take them out of its sum
    want = torch.nn.functional.kl_div(q[5:], p[5:], log_target=True, reduction="sum").item()
    assert want > 0 and abs(kl - want) < 1e-6 * want
    assert rank_p == 1 + int((p > p[9]).sum()) and rank_q == 1 + int((q > q[9]).sum())
    assert same == (int(p.argmax()) == int(q.argmax()))
