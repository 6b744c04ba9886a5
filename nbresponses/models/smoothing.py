"""SmoothQuant-style smoothing for the integer recipe: activation outliers moved into weights.

Why: ``fused-int8`` quantizes each row of activations with one scale (``fused._IntegerGraph``),
so a few channels with large values (the norms' weights make them) leave the others only a few
integer steps. Measured on the bundled model against the fused fp32 graph: per-column int8
weights alone keep 97.1% top-1 agreement; per-row uint8 activations alone drop it to 91.2%, most
at the QKV (94.4% when only they are quantized), the MLP's down (95.0%) and gate/up (95.7%)
inputs and the LM head (97.3%); the attention output feeding ``o`` costs little (99.1%) and is
left as it is (folding there would go through V's weights, shared by a group of heads).

Smoothing divides each input channel ``c`` of a matrix product by
``s_c = max|x_c| ** alpha / max_n |W_cn| ** (1 - alpha)`` and multiplies row ``c`` of the
weight by it (Xiao et al., SmoothQuant, 2023): the same product in exact arithmetic, with
activations that quantize better. The division is folded into the weights before it: the
RMSNorm's gamma for QKV, gate/up and the LM head, the up projection's columns for down
(the gated product is linear in them), so the graph has no extra node. ``max|x_c|`` comes from
running the fp32 source model over a calibration set (below), held apart from the fidelity set
so that prepare's fidelity report stays a measurement on text the recipe has not seen.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from nbresponses.models.fidelity_set import Sample, _chat, reference_spans
from nbresponses.models.layered import forward_all

ALPHA = 0.5  # SmoothQuant's default: the difficulty split evenly between activations and weights


@dataclass(frozen=True)
class Smoothing:
    """Per-channel activation peaks by linear name (``layers.{i}/qkv``, ``layers.{i}/gate_up``,
    ``layers.{i}/down``, ``lm_head``: the fused builder's names) and the migration strength."""

    peaks: Mapping[str, np.ndarray]
    alpha: float = ALPHA

    def factor(self, linear: str, weight_peaks: np.ndarray) -> np.ndarray:
        """``s`` for each input channel of ``linear``, given its weight's per-row peaks; 1 where
        a channel never fired or its weights are all zero."""
        peaks = np.asarray(self.peaks[linear], np.float64)
        weights = np.asarray(weight_peaks, np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            factor = peaks**self.alpha / weights ** (1 - self.alpha)
        usable = np.isfinite(factor) & (factor > 0) & (peaks > 0) & (weights > 0)
        return np.where(usable, factor, 1.0).astype(np.float32)


# Conversations of the kinds people send a small chat model, written for calibration only (not
# the fidelity set's texts): the channels' peaks, not the words, are what is read.
CALIBRATION_SET: tuple[Sample, ...] = (
    _chat(
        "explain",
        "Why do leaves change colour in autumn?",
        "In autumn the days get shorter and cooler, so trees stop making chlorophyll, the green "
        "pigment that captures sunlight. As it breaks down, yellow and orange pigments that "
        "were there all along become visible, and some trees also make red pigments from the "
        "sugars trapped in their leaves.",
    ),
    _chat(
        "code",
        "Write a Python function that returns the largest even number in a list, or None.",
        "def largest_even(numbers):\n    evens = [n for n in numbers if n % 2 == 0]\n"
        "    return max(evens) if evens else None\n\nFor example, largest_even([3, 8, 5, 12]) "
        "returns 12, and largest_even([1, 7]) returns None.",
    ),
    _chat(
        "list",
        "Give me four tips for a first trip abroad.",
        "1. Check that your passport is valid for at least six months.\n2. Tell your bank you "
        "are travelling so your card keeps working.\n3. Keep copies of your documents apart "
        "from the originals.\n4. Learn a few words of the local language: hello, please, thank "
        "you and excuse me go a long way.",
    ),
    _chat(
        "arithmetic",
        "A shop sells pens at 3 for 2 euros. How much do 12 pens cost?",
        "12 pens are 4 groups of 3 pens. Each group costs 2 euros, so 12 pens cost 4 x 2 = 8 "
        "euros.",
    ),
    _chat(
        "json",
        "Return a JSON object for a book with a title, an author, a year and a list of tags.",
        '{"title": "The Silent River", "author": "Maria Lenz", "year": 2019, "tags": ["novel", '
        '"mystery", "nature"]}',
    ),
    _chat(
        "multilingual",
        "Traduis en français : The weather is nice today, let's go for a walk in the park.",
        "Il fait beau aujourd'hui, allons nous promener dans le parc.",
    ),
    _chat(
        "chat",
        "Hi! I just adopted a cat.",
        "Congratulations! What is the cat's name, and how old is it?",
        "Her name is Miso and she is two.",
        "Miso is a lovely name. At two she is still playful: a few toys and a scratching post "
        "will keep her busy, and give her a quiet corner while she gets used to her new home.",
    ),
)


def _module(layer: Any, *names: str) -> Any:
    for name in names:
        module = layer
        for part in name.split("."):
            module = getattr(module, part, None)
            if module is None:
                break
        if module is not None:
            return module
    raise AttributeError(f"none of {names} in {type(layer).__name__}")


def activation_peaks(
    model: Any,
    tokenizer: Any,
    samples: tuple[Sample, ...] = CALIBRATION_SET,
    *,
    tensors: Mapping[str, Any] | None = None,
) -> dict[str, np.ndarray]:
    """max |x| per input channel of each smoothed linear, over the calibration conversations,
    from the fp32 PyTorch model (forward pre-hooks on its projections); ``tensors``: the
    weights of a skeleton ``model``, run one layer at a time (``layered.py``)."""

    inputs: dict[str, Any] = {}
    for i, layer in enumerate(model.model.layers):
        inputs[f"layers.{i}/qkv"] = _module(layer, "self_attn.q_proj", "self_attn.qkv_proj")
        inputs[f"layers.{i}/gate_up"] = _module(layer, "mlp.gate_proj", "mlp.gate_up_proj")
        inputs[f"layers.{i}/down"] = _module(layer, "mlp.down_proj")
    inputs["lm_head"] = model.lm_head
    peaks: dict[str, np.ndarray] = {}

    def hook(name: str) -> Any:
        def record(_module: Any, args: tuple[Any, ...]) -> None:
            peak = args[0].detach().abs().amax(dim=tuple(range(args[0].dim() - 1))).float()
            seen = peaks.get(name)
            peaks[name] = peak.numpy() if seen is None else np.maximum(seen, peak.numpy())

        return record

    handles = [m.register_forward_pre_hook(hook(n)) for n, m in inputs.items()]
    # The LM head's input is all the peaks need of it: its product (a fifth of a small model's
    # multiply-adds, and [positions, vocabulary] of logits a text) is not computed; it gives
    # one column instead, the rest of ``model(ids)`` as it is.
    model.lm_head.forward = lambda hidden: hidden[..., :1]
    try:
        texts = [(reference_spans(tokenizer, sample)[0], 0) for sample in samples]
        # every position, as model(ids); PyTorch's own threads: the peaks (and so the graph)
        # as prepares before streaming computed them
        for _ in forward_all(model, texts, tensors, side_by_side=False):
            pass
    finally:
        del model.lm_head.forward
        for handle in handles:
            handle.remove()
    return peaks
