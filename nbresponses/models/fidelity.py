"""How faithful is a quantized model to its fp32 export? Measured teacher-forced at prepare time.

Greedy answers are a poor test (docs/concepts/measurements.md: SmolLM2's first token for a simple
question has a 0.08-nat margin), so we compare full next-token distributions, on two kinds of text
built from the varied conversations of ``fidelity_set.py``:
- ``reference``: the assistant turns as written (what a scorer of given text sees);
- ``greedy``: the candidate's own greedy continuation of each prompt (what its users see).
Both models score the same tokens; we report top-1 agreement (with a 95% Wilson interval over
the scored tokens: tokens of one text are not independent, so the interval is, if anything,
too narrow), mean KL(fp32 || candidate), and the mean, p99 and max of |Δ logprob| of the text's
actual next token.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nbresponses.models.fidelity_set import FIDELITY_SET, Sample

SET_NAME = "nbresponses-fidelity-2"  # bump when the samples or the measure change
GREEDY_TOKENS = 48  # greedy continuation per prompt (stops earlier at eos)

# The first sample's first turn: kept for tests that want one short real conversation.
FIDELITY_CONVERSATION: list[dict[str, str]] = [dict(m) for m in FIDELITY_SET[0].messages]


@dataclass(frozen=True)
class FidelityReport:
    """Agreement of a candidate model with the fp32 reference over ``tokens`` scored positions."""

    tokens: int
    top1_agreement: float  # share of positions where both models' argmax agree
    top1_ci95: tuple[float, float]  # Wilson interval of that share
    mean_kl: float  # mean KL(reference || candidate) in nats
    mean_abs_dlogprob: float  # mean |Δ logprob| of the text's actual next token
    p99_abs_dlogprob: float
    max_abs_dlogprob: float
    reference: str = "fp32"
    by_text: dict[str, dict[str, Any]] = field(default_factory=dict)  # "reference", "greedy"
    measure: str = SET_NAME

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        low, high = self.top1_ci95
        return (
            f"top-1 agreement {self.top1_agreement:.1%} (95% CI {low:.1%}-{high:.1%}), "
            f"mean KL {self.mean_kl:.4f}, |Δ logprob| mean {self.mean_abs_dlogprob:.4f} / "
            f"p99 {self.p99_abs_dlogprob:.3f} / max {self.max_abs_dlogprob:.3f} "
            f"over {self.tokens} tokens vs {self.reference}"
        )


def wilson_interval(successes: int, trials: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (sound near 0 and 1, unlike p±2σ)."""
    if trials == 0:
        return (0.0, 1.0)
    p = successes / trials
    denominator = 1 + z * z / trials
    center = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return (max(0.0, center - half), min(1.0, center + half))


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


@dataclass
class _Scores:
    """Per scored position: do the argmaxes agree, the KL, |Δ logprob| of the target."""

    agree: np.ndarray
    kl: np.ndarray
    dlogprob: np.ndarray

    @classmethod
    def concat(cls, parts: list[_Scores]) -> _Scores:
        if not parts:
            empty = np.zeros(0)
            return cls(empty.astype(bool), empty, empty)
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in cls.__annotations__))

    def report(self, **extra: Any) -> FidelityReport:
        n = len(self.agree)
        if n == 0:
            raise ValueError("no scored tokens")
        return FidelityReport(
            tokens=n,
            top1_agreement=float(self.agree.mean()),
            top1_ci95=wilson_interval(int(self.agree.sum()), n),
            mean_kl=float(self.kl.mean()),
            mean_abs_dlogprob=float(self.dlogprob.mean()),
            p99_abs_dlogprob=float(np.quantile(self.dlogprob, 0.99)),
            max_abs_dlogprob=float(self.dlogprob.max()),
            **extra,
        )


def _score(reference: np.ndarray, candidate: np.ndarray, targets: np.ndarray) -> _Scores:
    ref_lp = log_softmax(reference.astype(np.float64))
    cand_lp = log_softmax(candidate.astype(np.float64))
    rows = np.arange(len(targets))
    return _Scores(
        agree=ref_lp.argmax(-1) == cand_lp.argmax(-1),
        kl=np.sum(np.exp(ref_lp) * (ref_lp - cand_lp), axis=-1),
        dlogprob=np.abs(ref_lp[rows, targets] - cand_lp[rows, targets]),
    )


def compare_logits(
    reference: np.ndarray, candidate: np.ndarray, targets: np.ndarray
) -> FidelityReport:
    """Fidelity of ``candidate`` to ``reference`` (both [positions, vocab]) on ``targets``."""
    return _score(reference, candidate, targets).report()


def _render(tokenizer: Any, messages: list[dict[str, str]], *, prompt: bool) -> list[int]:
    """Token ids of a conversation; ``prompt`` adds the assistant's opening. Without a chat
    template: the turns' texts joined by blank lines."""
    if getattr(tokenizer, "chat_template", None):
        return list(
            tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=prompt)
        )
    text = "\n\n".join(m["content"] for m in messages) + ("\n\n" if prompt and messages else "")
    return list(tokenizer(text)["input_ids"])


def reference_spans(tokenizer: Any, sample: Sample) -> tuple[list[int], list[tuple[int, int]]]:
    """The conversation's ids and the [start, end) spans of its assistant turns' tokens."""
    messages = [dict(m) for m in sample.messages]
    ids = _render(tokenizer, messages, prompt=False)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:i], prompt=True)
        through = _render(tokenizer, messages[: i + 1], prompt=False)
        start = _common_prefix(before, ids)
        end = min(_common_prefix(through, ids), len(ids))
        if end > start:
            spans.append((start, end))
    return ids, spans


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _feeds(session: Any, ids: list[int], room: int = 0) -> dict[str, np.ndarray]:
    """A first run's feeds. Graphs that write the KV in place at ``position_ids`` (the fused
    graph, ``fused.SCATTER_IN_PLACE``) get past buffers with room for the prompt and ``room``
    tokens more; the others an empty past that their present grows from."""
    from nbresponses.models.fused import KV_LAYOUT, LOGITS_TO_KEEP, SCATTER_IN_PLACE

    layout = session.get_modelmeta().custom_metadata_map.get(KV_LAYOUT)
    width = len(ids) + room if layout == SCATTER_IN_PLACE else 0
    feeds: dict[str, np.ndarray] = {}
    for spec in session.get_inputs():
        if spec.name == "input_ids":
            feeds[spec.name] = np.asarray([ids], dtype=np.int64)
        elif spec.name == "attention_mask":
            feeds[spec.name] = np.ones((1, len(ids)), dtype=np.int64)
        elif spec.name == "position_ids":
            feeds[spec.name] = np.arange(len(ids), dtype=np.int64)[None, :]
        elif spec.name.startswith("past_key_values"):
            heads, head_dim = spec.shape[1], spec.shape[3]
            dtype = np.float16 if "float16" in spec.type else np.float32
            feeds[spec.name] = np.zeros((1, heads, width, head_dim), dtype=dtype)
        elif spec.name == LOGITS_TO_KEEP:
            feeds[spec.name] = np.zeros(1, np.int64)  # every position
    return feeds


def full_sequence_logits(session: Any, ids: list[int]) -> np.ndarray:
    """Logits for every position of ``ids`` in one forward pass with an empty KV cache."""
    (logits,) = session.run(["logits"], _feeds(session, ids))
    return logits[0].astype(np.float32)


def greedy_continuation(
    session: Any, ids: list[int], max_new: int, stop_ids: set[int]
) -> list[int]:
    """The session's greedy tokens after ``ids`` (batch 1, KV cache fed back), eos included."""
    pasts = [i.name for i in session.get_inputs() if i.name.startswith("past_key_values")]
    presents = [name.replace("past_key_values.", "present.") for name in pasts]
    names = {i.name for i in session.get_inputs()}
    feeds = _feeds(session, ids, room=max_new)
    keep = {k: v for k, v in feeds.items() if k == "num_logits_to_keep"}
    out: list[int] = []
    length = len(ids)
    for _ in range(max_new):
        logits, *kv = session.run(["logits", *presents], feeds)
        token = int(np.argmax(logits[0, -1]))
        out.append(token)
        if token in stop_ids:
            break
        length += 1
        feeds = {**dict(zip(pasts, kv, strict=True)), **keep}
        feeds["input_ids"] = np.array([[token]], np.int64)
        if "attention_mask" in names:
            feeds["attention_mask"] = np.ones((1, length), np.int64)
        if "position_ids" in names:
            feeds["position_ids"] = np.array([[length - 1]], np.int64)
    return out


def _stop_ids(tokenizer: Any) -> set[int]:
    eos = getattr(tokenizer, "eos_token_id", None)
    return {int(eos)} if eos is not None else set()


def measure_fidelity(
    reference_model: Path,
    candidate_model: Path,
    tokenizer: Any,
    *,
    samples: tuple[Sample, ...] = FIDELITY_SET,
    greedy_tokens: int = GREEDY_TOKENS,
) -> FidelityReport:
    """Teacher-forced comparison of two ONNX files on reference and greedy continuations."""
    import onnxruntime as ort

    texts = [reference_spans(tokenizer, s) for s in samples]
    if os.path.samefile(reference_model, candidate_model):  # the fp32 recipe is the export
        agree = np.ones(sum(e - s for _, spans in texts for s, e in spans), bool)
        zeros = np.zeros(len(agree))
        exact = _Scores(agree, zeros, zeros)
        return exact.report(by_text={"reference": exact.report().as_dict()})
    options = ort.SessionOptions()
    options.log_severity_level = 3
    ref = ort.InferenceSession(str(reference_model), options, providers=["CPUExecutionProvider"])
    cand = ort.InferenceSession(str(candidate_model), options, providers=["CPUExecutionProvider"])

    def scores(ids: list[int], spans: list[tuple[int, int]]) -> _Scores:
        # position p predicts token p + 1: the logits before each span's tokens
        positions = np.concatenate([np.arange(s - 1, e - 1) for s, e in spans])
        targets = np.asarray(ids, np.int64)[positions + 1]
        a, b = (full_sequence_logits(m, ids)[positions] for m in (ref, cand))
        return _score(a, b, targets)

    by_text = {"reference": _Scores.concat([scores(ids, spans) for ids, spans in texts])}
    greedy = []
    for sample in samples:
        prompt = _render(tokenizer, [dict(m) for m in sample.messages[:-1]], prompt=True)
        new = greedy_continuation(cand, prompt, greedy_tokens, _stop_ids(tokenizer))
        greedy.append(scores(prompt + new, [(len(prompt), len(prompt) + len(new))]))
    by_text["greedy"] = _Scores.concat(greedy)
    return _Scores.concat(list(by_text.values())).report(
        by_text={name: s.report().as_dict() for name, s in by_text.items()}
    )
