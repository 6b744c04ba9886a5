"""gpt-oss end to end: a tiny random-weight GptOssForCausalLM exported by Optimum, run by the
real ONNX engine, served through harmony by the Responses client.

The weights are random, so the tokens are noise; what is checked is the plumbing: the export
(which takes no ``position_ids``), the engine's batching over it, harmony rendering and parsing
of whatever comes out, and a well-formed Response. No gpt-oss tokenizer exists offline, so the
prepared folder is assembled by hand (the harmony format renders with its own encoding).
"""

from __future__ import annotations

import json
import types

import pytest

from nbresponses.models.prepared import PreparedModel
from nbresponses.runtime.generator import TokenGenerator
from nbresponses.service.client import AsyncResponsesClient

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_gpt_oss(tmp_path_factory) -> PreparedModel:
    torch = pytest.importorskip("torch")
    from optimum.exporters.onnx import main_export
    from transformers import GptOssConfig, GptOssForCausalLM

    from nbresponses.models.export import quiet_export

    root = tmp_path_factory.mktemp("gpt-oss")
    config = GptOssConfig(
        vocab_size=201088,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=512,
        sliding_window=32,
        eos_token_id=200002,
        pad_token_id=199999,
        bos_token_id=199998,
    )
    torch.manual_seed(0)
    GptOssForCausalLM(config).eval().save_pretrained(root / "hf")
    with quiet_export():
        main_export(
            str(root / "hf"),
            output=str(root / "onnx"),
            task="text-generation-with-past",
            do_validation=False,
        )
    folder = root / "onnx"
    (folder / "manifest.json").write_text(
        json.dumps(
            {
                "name": "tiny-gpt-oss",
                "recipe": {"name": "fp32"},
                "fidelity": {},
            }
        )
    )
    return PreparedModel.open(folder)


async def test_a_gpt_oss_export_runs_through_harmony(tiny_gpt_oss) -> None:
    from helpers.responses import check_stream

    assert tiny_gpt_oss.config["model_type"] == "gpt_oss"
    tokenizer = types.SimpleNamespace(eos_token_id=200002, bos_token_id=199998)
    engine = TokenGenerator(tiny_gpt_oss, tokenizer=tokenizer, max_batch_size=4)
    try:
        client = AsyncResponsesClient(
            engine, tokenizer, model="tiny-gpt-oss", config=tiny_gpt_oss.config
        )
        streams = [
            await client.responses.create(
                input=f"Hello {i}", max_output_tokens=12, temperature=0, stream=True
            )
            for i in range(3)
        ]
        for stream in streams:  # three requests batched by the engine
            events = [event async for event in stream]
            check_stream(events)
            final = events[-1].response
            assert final.status in ("completed", "incomplete"), final
            assert 1 <= final.usage.output_tokens <= 12
            assert final.usage.input_tokens > 20  # harmony's system + user prompt
    finally:
        await engine.aclose()
