"""How faithful is a quantized model to its fp32 export? Measured teacher-forced at prepare time.

Greedy answers are a poor test (DESIGN.md: SmolLM2's first token for a simple question has a
0.08-nat margin), so we compare full next-token distributions over a fixed conversation.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

# A fixed conversation; the assistant turns are what a chat model actually produces, so the
# positions we score are the ones users see. A few hundred tokens with a typical tokenizer.
FIDELITY_CONVERSATION: list[dict[str, str]] = [
    {
        "role": "user",
        "content": "What is the capital of France, and why did it become the capital?",
    },
    {
        "role": "assistant",
        "content": (
            "The capital of France is Paris. It became the capital because it sat at the heart of "
            "the lands held by the early Capetian kings, on an island in the Seine that was easy "
            "to defend and well placed for trade. Over the centuries the royal court, the "
            "university and the main institutions of government gathered there, so Paris grew "
            "into the political, economic and cultural centre of the country."
        ),
    },
    {
        "role": "user",
        "content": "Write a short Python function that returns the n-th Fibonacci number.",
    },
    {
        "role": "assistant",
        "content": (
            "Here is a simple iterative version:\n\n```python\ndef fibonacci(n: int) -> int:\n"
            "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
            "    return a\n```\n\n"
            "It runs in linear time and constant memory. For example, fibonacci(10) returns 55."
        ),
    },
    {"role": "user", "content": "Give me three tips for sleeping better."},
    {
        "role": "assistant",
        "content": (
            "1. Keep a regular schedule: go to bed and wake up at the same time every day, even "
            "on weekends.\n2. Make your bedroom dark, quiet and cool, and keep screens out of it "
            "for the last hour before sleep.\n3. Avoid caffeine in the afternoon and heavy meals "
            "late in the evening, and try to get some daylight and exercise during the day."
        ),
    },
]


@dataclass(frozen=True)
class FidelityReport:
    """Agreement of a candidate model with the fp32 reference over ``tokens`` scored positions."""

    tokens: int
    top1_agreement: float  # share of positions where both models' argmax agree
    mean_kl: float  # mean KL(reference || candidate) in nats
    mean_abs_dlogprob: float  # mean |Δ logprob| of the text's actual next token
    max_abs_dlogprob: float
    reference: str = "fp32"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        return (
            f"top-1 agreement {self.top1_agreement:.1%}, mean KL {self.mean_kl:.4f}, "
            f"|Δ logprob| mean {self.mean_abs_dlogprob:.4f} / max {self.max_abs_dlogprob:.3f} "
            f"over {self.tokens} tokens vs {self.reference}"
        )


def fidelity_tokens(tokenizer: Any) -> tuple[list[int], int]:
    """Token ids of the fixed conversation and the index of the first assistant token.

    Positions from that index on are scored. Falls back to plain text without a chat template.
    """
    conversation = FIDELITY_CONVERSATION
    if getattr(tokenizer, "chat_template", None):
        ids = list(tokenizer.apply_chat_template(conversation, tokenize=True))
        prefix = tokenizer.apply_chat_template(
            conversation[:1], tokenize=True, add_generation_prompt=True
        )
        return ids, len(prefix)
    text = "\n\n".join(m["content"] for m in conversation)
    return list(tokenizer(text)["input_ids"]), 1


def full_sequence_logits(session: Any, ids: list[int]) -> np.ndarray:
    """Logits for every position of ``ids`` in one forward pass with an empty KV cache."""
    length = len(ids)
    feeds: dict[str, np.ndarray] = {}
    for spec in session.get_inputs():
        if spec.name == "input_ids":
            feeds[spec.name] = np.asarray([ids], dtype=np.int64)
        elif spec.name == "attention_mask":
            feeds[spec.name] = np.ones((1, length), dtype=np.int64)
        elif spec.name == "position_ids":
            feeds[spec.name] = np.arange(length, dtype=np.int64)[None, :]
        elif spec.name.startswith("past_key_values"):
            heads, head_dim = spec.shape[1], spec.shape[3]
            dtype = np.float16 if "float16" in spec.type else np.float32
            feeds[spec.name] = np.zeros((1, heads, 0, head_dim), dtype=dtype)
    (logits,) = session.run(["logits"], feeds)
    return logits[0].astype(np.float32)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def compare_logits(
    reference: np.ndarray, candidate: np.ndarray, targets: np.ndarray
) -> FidelityReport:
    """Fidelity of ``candidate`` to ``reference`` (both [positions, vocab]) on ``targets``."""
    ref_lp = log_softmax(reference.astype(np.float64))
    cand_lp = log_softmax(candidate.astype(np.float64))
    agreement = float(np.mean(ref_lp.argmax(-1) == cand_lp.argmax(-1)))
    kl = np.sum(np.exp(ref_lp) * (ref_lp - cand_lp), axis=-1)
    rows = np.arange(len(targets))
    dlogprob = np.abs(ref_lp[rows, targets] - cand_lp[rows, targets])
    return FidelityReport(
        tokens=len(targets),
        top1_agreement=agreement,
        mean_kl=float(np.mean(kl)),
        mean_abs_dlogprob=float(np.mean(dlogprob)),
        max_abs_dlogprob=float(np.max(dlogprob)),
    )


def measure_fidelity(
    reference_model: Path, candidate_model: Path, tokenizer: Any
) -> FidelityReport:
    """Teacher-forced comparison of two ONNX files over the fixed conversation."""
    import onnxruntime as ort

    ids, start = fidelity_tokens(tokenizer)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    logits = []
    for path in (reference_model, candidate_model):
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        # position p predicts token p+1: score predictions of the assistant turns
        logits.append(full_sequence_logits(session, ids)[start - 1 : len(ids) - 1])
        del session
    targets = np.asarray(ids[start:], dtype=np.int64)
    return compare_logits(logits[0], logits[1], targets)
