"""What each decoder family does differently from Llama, for the fused graph builder.

Why a table of small differences: the decoders people run on a CPU (Llama 3.x, Mistral, Qwen2/3,
SmolLM3, Gemma 3, Phi-3/4) are one loop of attention and gated MLP with a handful of variations
(q/k norms, packed weights, norms around each sub-layer, which layers rotate or see a window).
``fused.py`` writes the loop once and asks the ``Architecture`` here; each entry mirrors its
``transformers`` modeling file, the reference the fused graph must equal.

What the builder refuses (``problems``) is what it would get wrong: anything it cannot express
exactly with ONNX Runtime's fused kernels.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# rope types whose cos/sin are a fixed function of the position (transformers recomputes
# "dynamic" from each call's longest position; "longrope" switches factors past
# original_max_position_embeddings, so its graph stops there: see ``max_positions``)
STATIC_ROPE = (None, "default", "linear", "llama3", "yarn")
CAPPED_ROPE = ("longrope",)


def _layer_types_window(config: Any, layer: int) -> int | None:
    """Qwen2, Qwen3, Gemma 3: a window on the layers ``layer_types`` marks as sliding."""
    types = getattr(config, "layer_types", None) or []
    sliding = layer < len(types) and types[layer] == "sliding_attention"
    return config.sliding_window if sliding and config.sliding_window else None


def _smollm3_window(config: Any, layer: int) -> int | None:
    return _layer_types_window(config, layer) if config.use_sliding_window else None


def _every_layer_window(config: Any, layer: int) -> int | None:
    """Mistral, Phi-3: one window (or none) for every layer."""
    return getattr(config, "sliding_window", None) or None


def _no_window(config: Any, layer: int) -> int | None:
    return None


def _always_rotary(config: Any, layer: int) -> str | None:
    return "global"


def _smollm3_rotary(config: Any, layer: int) -> str | None:
    """SmolLM3's ``no_rope_layers``: 1 rotates, 0 does not (every fourth layer in the 3B)."""
    return "global" if config.no_rope_layers[layer] else None


def _gemma3_rotary(config: Any, layer: int) -> str | None:
    """Gemma 3: sliding layers rotate with their own base (``rope_local_base_freq``)."""
    return "local" if config.layer_types[layer] == "sliding_attention" else "global"


def _head_dim_scale(config: Any) -> float:
    return float(head_dim(config) ** -0.5)


def _gemma_scale(config: Any) -> float:
    return float(config.query_pre_attn_scalar**-0.5)


@dataclass(frozen=True)
class Architecture:
    """One decoder family's differences from Llama (the defaults)."""

    activation: str = "silu"  # of the gated MLP: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    activation_key: str = "hidden_act"  # the config attribute that names it
    packed_qkv: bool = False  # Phi-3: one qkv_proj
    packed_gate_up: bool = False  # Phi-3: one gate_up_proj
    qk_norm: bool = False  # Qwen3, Gemma 3: RMSNorm of each head's query and key
    sandwich_norms: bool = False  # Gemma 3: norms after attention and MLP, and before the MLP
    norm_offset: float = 0.0  # Gemma: the norms scale by (1 + weight)
    scaled_embeddings: bool = False  # Gemma: embeddings times sqrt(hidden_size)
    window: Callable[[Any, int], int | None] = _no_window  # a layer's sliding window
    rotary: Callable[[Any, int], str | None] = _always_rotary  # a layer's rotary table, or none
    attention_scale: Callable[[Any], float] = _head_dim_scale


_LLAMA = Architecture()
_QWEN2 = Architecture(window=_layer_types_window)
ARCHITECTURES: dict[str, Architecture] = {
    "llama": _LLAMA,
    "mistral": Architecture(window=_every_layer_window),
    "qwen2": _QWEN2,
    "qwen3": Architecture(qk_norm=True, window=_layer_types_window),
    "smollm3": Architecture(window=_smollm3_window, rotary=_smollm3_rotary),
    "gemma3_text": Architecture(
        activation="gelu_tanh",
        activation_key="hidden_activation",
        qk_norm=True,
        sandwich_norms=True,
        norm_offset=1.0,
        scaled_embeddings=True,
        window=_layer_types_window,
        rotary=_gemma3_rotary,
        attention_scale=_gemma_scale,
    ),
    "phi3": Architecture(packed_qkv=True, packed_gate_up=True, window=_every_layer_window),
}
_ACTIVATIONS = {"silu": ("silu", "swish"), "gelu_tanh": ("gelu_pytorch_tanh",)}


def head_dim(config: Any) -> int:
    return int(
        getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    )


def rope_type(config: Any) -> str | None:
    scaling = getattr(config, "rope_scaling", None) or {}
    return scaling.get("rope_type", scaling.get("type")) if scaling else None


def max_positions(config: Any) -> int:
    """Positions the graph's rotary tables cover, and so the longest context it runs.

    Long-rope (Phi-3.5, Phi-4-mini) is exact only up to ``original_max_position_embeddings``:
    beyond it transformers switches every position of a call, cached keys excepted, to the long
    factors, so a position's numbers would depend on how the text was split into calls. The
    graph keeps the short factors and its context stops there (4,096 tokens on those models).
    """
    if rope_type(config) in CAPPED_ROPE:
        original = getattr(config, "original_max_position_embeddings", None)
        original = original or (config.rope_scaling or {}).get("original_max_position_embeddings")
        return int(original or config.max_position_embeddings)
    return int(config.max_position_embeddings)


def layer_windows(config: Any) -> list[int | None]:
    """Each layer's sliding window (keys it sees, its own included), None when it has none or
    the window covers every position anyway."""
    arch = ARCHITECTURES[config.model_type]
    limit = max_positions(config)
    windows = [arch.window(config, i) for i in range(config.num_hidden_layers)]
    return [w if w is not None and w < limit else None for w in windows]


def layer_rotary(config: Any) -> list[str | None]:
    """Each layer's rotary table ("global", "local") or None for a layer without rotary."""
    arch = ARCHITECTURES[config.model_type]
    return [arch.rotary(config, i) for i in range(config.num_hidden_layers)]


def final_logit_softcap(config: Any) -> float | None:
    """Gemma's ``tanh(logits / cap) * cap`` on the logits, when its config sets a cap."""
    cap = getattr(config, "final_logit_softcapping", None)
    return float(cap) if cap else None


def rotary_dim(config: Any) -> int:
    return int(head_dim(config) * getattr(config, "partial_rotary_factor", 1.0))


def problems(config: Any) -> list[str]:
    """Why the fused builder would get this model wrong; empty when it covers it."""
    model_type = getattr(config, "model_type", None)
    arch = ARCHITECTURES.get(model_type)  # type: ignore[arg-type]
    if arch is None:
        return [f"model_type {model_type!r} (supported: {', '.join(ARCHITECTURES)})"]
    found = []
    act = getattr(config, arch.activation_key, None)
    if act not in _ACTIVATIONS[arch.activation]:
        found.append(
            f"{arch.activation_key} {act!r} (only {', '.join(_ACTIVATIONS[arch.activation])})"
        )
    if getattr(config, "mlp_bias", False):
        found.append("mlp_bias")
    if getattr(config, "attention_bias", False) and model_type != "qwen2":
        found.append("attention_bias")
    kind = rope_type(config)
    if kind not in STATIC_ROPE + CAPPED_ROPE:
        found.append(
            f"rope_scaling {kind!r} (supported: default, linear, llama3, yarn, longrope capped "
            "at original_max_position_embeddings)"
        )
    if getattr(config, "use_bidirectional_attention", False):
        found.append("bidirectional attention")
    rot = rotary_dim(config)
    if rot != head_dim(config) and (rot % 16 or rot > head_dim(config)):
        found.append(f"partial rotary of {rot} of {head_dim(config)} dims (needs a multiple of 16)")
    if not math.isclose(getattr(config, "partial_rotary_factor", 1.0) * head_dim(config), rot):
        found.append("partial rotary that is not a whole number of dims")
    return found
