"""Run the logit lens graph (``models/lens.py``) on a token sequence: per layer and position,
the top tokens, the logprob and rank of the token that comes next, and the KL divergence
from the last layer's distribution.

A session of its own, opened on first use and kept: ONNX Runtime reads the prepared model's
weight file again (the lens graph has extra outputs the decoding graph must not have). One
pass computes every position; the outputs are small (``TOP_K`` tokens a position and layer).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from nbresponses.models import kernels
from nbresponses.models.lens import NEXT_IDS, OUTPUTS, lens_path
from nbresponses.runtime.kv import KVBuffer
from nbresponses.runtime.runner import session_options


@dataclass(frozen=True)
class LensResult:
    """Layer ``l`` (0: the embeddings .. L: the model's output) at position ``p``, which reads
    ``token_ids[: p + 1]`` and predicts ``token_ids[p + 1]`` (the last position predicts
    nothing given: its ``next_*`` are NaN)."""

    token_ids: tuple[int, ...]
    top_ids: np.ndarray  # [L + 1, S, k] most likely next tokens, best first
    top_logprobs: np.ndarray  # [L + 1, S, k]
    next_logprob: np.ndarray  # [L + 1, S] of the token that comes next
    next_rank: np.ndarray  # [L + 1, S] 1 = the most likely token (float: NaN at the last position)
    kl: np.ndarray  # [L + 1, S] KL(final || layer), nats


class LogitLens:
    """The lens of one prepared (fused) model; ``run(token_ids)`` is thread-safe."""

    def __init__(self, model_dir: Path, *, threads: int | None = None) -> None:
        path = lens_path(model_dir)
        options = kernels.for_model(session_options(threads), path)
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        pasts = [i for i in self.session.get_inputs() if i.name.startswith("past_key_values.")]
        self._pasts = {p.name: KVBuffer.of_input(p) for p in pasts}

    def run(self, token_ids: Sequence[int]) -> LensResult:
        ids = np.asarray([int(t) for t in token_ids], np.int64)
        count = ids.shape[0]
        if count < 1:
            raise ValueError("the lens needs at least one token")
        feeds = {
            "input_ids": ids[None],
            "position_ids": np.arange(count, dtype=np.int64)[None],
            "num_logits_to_keep": np.array([0], np.int64),
            NEXT_IDS: np.concatenate([ids[1:], ids[-1:]])[None],
            # the graph writes each token's key and value at its position: room for all
            **{name: buffer.zeros(count, 1) for name, buffer in self._pasts.items()},
        }
        top_ids, top_lp, next_lp, rank, kl = self.session.run(list(OUTPUTS), feeds)
        next_lp = next_lp[..., 0].astype(np.float64)
        ranks = rank[..., 0].astype(np.float64) + 1.0
        next_lp[:, -1] = np.nan
        ranks[:, -1] = np.nan
        return LensResult(
            token_ids=tuple(int(t) for t in ids),
            top_ids=top_ids.astype(np.int64),
            top_logprobs=top_lp.astype(np.float64),
            next_logprob=next_lp,
            next_rank=ranks,
            kl=kl[..., 0].astype(np.float64),
        )
