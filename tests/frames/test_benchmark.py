"""The vectorised logprobs_frame agrees with the benchmark's naive per-row baseline."""

from __future__ import annotations

import importlib.util

import numpy as np
from helpers.paths import ROOT
from openai._models import construct_type
from openai.types.responses import Response

from nbresponses.frames import logprobs_frame

_PATH = ROOT / "benchmarks" / "frames.py"
_spec = importlib.util.spec_from_file_location("frames_benchmark", _PATH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_vectorised_frame_matches_naive_baseline() -> None:
    as_dict = bench.synthetic_response(3000, 5, seed=1)
    response = construct_type(type_=Response, value=as_dict)
    fast = logprobs_frame(response)
    naive = bench.naive_logprobs_frame(response)
    assert len(fast) == len(naive) == 3000
    for column in ["position", "byte_offset", "char_offset", "logprob"]:
        assert np.array_equal(fast[column].to_numpy(), naive[column].to_numpy()), column
    for column in ["token", "text", "bytes", "runner_up"]:
        assert fast[column].astype(object).tolist() == naive[column].tolist(), column
    assert np.allclose(fast["prob"], naive["prob"], rtol=1e-15, atol=0)
    assert np.allclose(fast["margin"], naive["margin"], equal_nan=True)
    assert np.allclose(fast["topk_entropy"], naive["topk_entropy"])
    assert fast["rank"].astype(float).fillna(0).tolist() == naive["rank"].fillna(0).tolist()
    assert "".join(fast["text"]) == response.output[0].content[0].text
