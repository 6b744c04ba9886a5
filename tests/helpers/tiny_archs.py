"""Tiny random-weight decoders of each architecture the fused builder covers, from configs.

Each is the shape of a real family (Llama 3.x's rope scaling, Mistral's window on every layer,
Qwen3's q/k norms, SmolLM3's layers without rotary, Gemma 3's sandwich norms, sliding windows and
soft-capped logits, Phi-3/4's packed weights, long-rope and partial rotary) at 64-128 wide and 2-3
layers, so a test builds, exports and runs one in seconds. Their answers are noise; their
arithmetic is the real one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

SLIDING_WINDOW = 8  # Gemma 3's tiny window: prompts of the tests run well past it
WEIGHT_SCALE = 4.0  # times the default init: peaky logits, yet rounding stays near fp32 epsilon


def _common(vocab_size: int, **extra: Any) -> dict[str, Any]:
    return {
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "tie_word_embeddings": True,
        **extra,
    }


def llama3(vocab_size: int) -> Any:
    from transformers import LlamaConfig

    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    return LlamaConfig(**_common(vocab_size, rope_scaling=scaling, rope_theta=500000.0))


def mistral(vocab_size: int) -> Any:
    """Mistral 7B v0.1's shape: one sliding window on every layer."""
    from transformers import MistralConfig

    return MistralConfig(**_common(vocab_size, sliding_window=SLIDING_WINDOW))


def qwen3(vocab_size: int) -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(**_common(vocab_size, head_dim=32, rope_theta=1000000.0))


def smollm3(vocab_size: int) -> Any:
    from transformers import SmolLM3Config

    # layers 0 and 2 rotate, layer 1 has no rotary (SmolLM3-3B: every fourth layer)
    return SmolLM3Config(**_common(vocab_size, num_hidden_layers=3, no_rope_layers=[1, 0, 1]))


def gemma3(vocab_size: int) -> Any:
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(
        **_common(
            vocab_size,
            num_hidden_layers=3,
            head_dim=16,
            num_key_value_heads=1,
            query_pre_attn_scalar=24,  # not head_dim: the attention scale comes from here
            sliding_window=SLIDING_WINDOW,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_theta=1000000.0,
            rope_local_base_freq=10000.0,
            rope_scaling={"rope_type": "linear", "factor": 8.0},  # the global layers' only
            final_logit_softcapping=4.0,  # low enough that tanh bends the logits
        )
    )


def _phi3(vocab_size: int, *, partial_rotary_factor: float, tied: bool, **shape: int) -> Any:
    from transformers import Phi3Config

    common = _common(vocab_size, max_position_embeddings=4096, tie_word_embeddings=tied, **shape)
    head = common["hidden_size"] // common["num_attention_heads"]
    half = int(head * partial_rotary_factor) // 2
    return Phi3Config(
        **common,
        original_max_position_embeddings=1024,
        partial_rotary_factor=partial_rotary_factor,
        rope_scaling={
            "type": "longrope",
            "short_factor": [1.0 + 0.1 * i for i in range(half)],
            "long_factor": [2.0 + 0.5 * i for i in range(half)],
        },
    )


def phi3(vocab_size: int) -> Any:
    """Phi-3.5-mini's shape: packed qkv and gate/up, long-rope beyond 1,024 positions."""
    return _phi3(vocab_size, partial_rotary_factor=1.0, tied=False)


def phi4_mini(vocab_size: int) -> Any:
    """Phi-4-mini's shape: Phi-3's with partial rotary (3/4 of each head: 48 of 64 dims, as
    96 of 128 in the real one; GroupQueryAttention rotates multiples of 16), tied embeddings."""
    return _phi3(
        vocab_size,
        partial_rotary_factor=0.75,
        tied=True,
        hidden_size=128,
        num_attention_heads=2,
        num_key_value_heads=1,
    )


ARCHITECTURES: dict[str, Callable[[int], Any]] = {
    "llama3": llama3,
    "mistral": mistral,
    "qwen3": qwen3,
    "smollm3": smollm3,
    "gemma3": gemma3,
    "phi3": phi3,
    "phi4-mini": phi4_mini,
}


def build_tiny_model(
    name: str,
    vocab_size: int,
    *,
    seed: int = 0,
    special_ids: dict[str, int] | None = None,
    **changes: Any,
) -> Any:
    """The seeded random-weight PyTorch model of architecture ``name``, in eval mode.

    ``special_ids``: ``bos_token_id``, ``eos_token_id``, ``pad_token_id`` of the tokenizer it
    is meant for (the configs' defaults are the real models', outside a tiny vocabulary);
    ``changes``: other config attributes to set.
    """
    import torch
    from transformers import AutoModelForCausalLM

    config = ARCHITECTURES[name](vocab_size)
    for key, value in {**(special_ids or {"pad_token_id": 0}), **changes}.items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():  # larger weights than the default init: peakier, more varied logits
        for param_name, param in model.named_parameters():
            if param_name.endswith("norm.weight") and config.model_type.startswith("gemma"):
                param.normal_(0.0, 0.5)  # Gemma's norms are (1 + w), zero at init
            else:
                param.mul_(WEIGHT_SCALE)
    return model


def save_tiny_model(name: str, folder: Path, tokenizer_folder: Path, *, seed: int = 0) -> Path:
    """Write a Hugging Face folder (config, weights, the bundled tokenizer) for ``name``."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_folder))
    special = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    model = build_tiny_model(name, len(tokenizer), seed=seed, special_ids=special)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


def prepare_tiny(model: Any, graph: Any, folder: Path, tokenizer: Any, recipe: str) -> Any:
    """A prepared folder of ``model`` (its fused ``graph``, a ``ModelProto``) for a fused
    ``recipe``, as ``prepare_model`` writes it, without the export and fidelity. MatMulNBits
    recipes quantize the fp32 ``graph`` here; for others ``graph`` is built as the recipe does."""
    import json

    from nbresponses.models.fused import save_model
    from nbresponses.models.prepared import PreparedModel
    from nbresponses.models.recipes import MODEL_FILE, RECIPES, quantize_nbits

    folder.mkdir(parents=True, exist_ok=True)
    params = RECIPES[recipe].params
    if recipe in ("fused-q8", "fused-q4"):  # others: ``graph`` is already the recipe's
        quantized = quantize_nbits(graph, params["bits"], quantize_head=True)
        quantized.save_model_to_file(str(folder / MODEL_FILE), use_external_data_format=False)
    else:
        save_model(graph, folder / MODEL_FILE)
    model.config.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    manifest = {"kind": "prepared", "name": folder.name, "recipe": {"name": recipe, **params}}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return PreparedModel.open(folder)
