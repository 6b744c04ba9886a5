"""gpt-oss end to end: a tiny random-weight GptOssForCausalLM exported by Optimum, run by the
real ONNX engine, served through harmony by the Responses client.

The weights are random, so the tokens are noise; what is checked is the plumbing: the export
(which takes no ``position_ids``), the engine's batching over it, harmony rendering and parsing
of whatever comes out, and a well-formed Response. No gpt-oss tokenizer exists offline, so the
prepared folder is assembled by hand (the harmony format renders with its own encoding).
"""

from __future__ import annotations

import asyncio
import json
import types

import pytest

from nbresponses.models.prepared import PreparedModel
from nbresponses.runtime.generator import TokenGenerator
from nbresponses.service.client import AsyncResponsesClient

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_gpt_oss(tmp_path_factory) -> PreparedModel:
    return export_tiny(tmp_path_factory.mktemp("gpt-oss"))


@pytest.fixture(scope="module")
def steered_gpt_oss(tmp_path_factory) -> PreparedModel:
    """Random weights, except that the model ends its reasoning: one dimension of every
    embedding is large, and only the unembedding rows of "final" and <|end|> read it, so
    those two win wherever the grammar allows them (everything else stays random)."""
    return export_tiny(tmp_path_factory.mktemp("gpt-oss-steered"), steer=(17196, 200007))


def export_tiny(root, steer: tuple[int, ...] = ()) -> PreparedModel:
    torch = pytest.importorskip("torch")
    from optimum.exporters.onnx import main_export
    from transformers import GptOssConfig, GptOssForCausalLM

    from nbresponses.models.export import quiet_export

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
    model = GptOssForCausalLM(config).eval()
    if steer:
        with torch.no_grad():
            model.model.embed_tokens.weight[:, 0] = 1.0
            model.lm_head.weight[list(steer), 0] = 1.0
    model.save_pretrained(root / "hf")
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


BOUNDED = {  # every JSON value of it is short: a random model cannot ramble inside it
    "type": "object",
    "properties": {
        "size": {"enum": ["small", "big"]},
        "ok": {"type": "boolean"},
        "tag": {"type": "string", "maxLength": 3},
    },
    "required": ["size", "ok", "tag"],
    "additionalProperties": False,
}


async def test_a_random_gpt_oss_under_a_schema_writes_valid_json_batched_or_alone(
    steered_gpt_oss,
) -> None:
    """Random weights, held to a schema by the grammar over the o200k vocabulary: the final
    message is valid JSON of the schema. Batched with a free row, the constrained row's tokens
    and logprobs are the same as alone (its mask depends on its own tokens only)."""
    import jsonschema

    tokenizer = types.SimpleNamespace(eos_token_id=200002, bos_token_id=199998)
    engine = TokenGenerator(steered_gpt_oss, tokenizer=tokenizer, max_batch_size=4)
    fmt = {"format": {"type": "json_schema", "name": "t", "schema": BOUNDED, "strict": True}}
    constrained = {
        "input": "Describe it.",
        "text": fmt,
        "temperature": 0,
        "max_output_tokens": 200,
        "include": ["message.output_text.logprobs"],
        "top_logprobs": 2,
    }
    try:
        client = AsyncResponsesClient(
            engine, tokenizer, model="tiny-gpt-oss", config=steered_gpt_oss.config
        )
        free = {"input": "Hello", "temperature": 0, "max_output_tokens": 40}
        batched, _ = await asyncio.gather(
            client.responses.create(**constrained), client.responses.create(**free)
        )
        alone = await client.responses.create(**constrained)
    finally:
        await engine.aclose()
    for r in (batched, alone):
        assert r.status == "completed", (r.status, r.error, r.output)
        assert r.output[-1].type == "message" and r.output[-1].phase == "final_answer"
        jsonschema.validate(json.loads(r.output_text), BOUNDED)
    dump = [strip(i) for i in batched.output]
    assert dump == [strip(i) for i in alone.output]
    part = batched.output[-1].content[0]
    assert part.logprobs and len(part.logprobs) >= 3


def strip(item) -> dict:
    data = item.model_dump()
    data.pop("id", None)
    return data
