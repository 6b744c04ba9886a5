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
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nbresponses.models import kernels
from nbresponses.models.fidelity_set import FIDELITY_SET, Sample, reference_spans, render_ids
from nbresponses.models.graph_contract import KV_LAYOUT, LOGITS_TO_KEEP, SCATTER_IN_PLACE
from nbresponses.models.heap import trim_heap

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


_SCORE_ROWS = 64  # positions scored at a time: float64 [rows, vocab] temporaries stay small


def _score(reference: np.ndarray, candidate: np.ndarray, targets: np.ndarray) -> _Scores:
    """Per position; in blocks of rows (every quantity is computed row by row, so blocks give
    the same numbers as one pass, without ~0.5 GB of float64 temporaries for a long text)."""
    parts = []
    for start in range(0, max(len(targets), 1), _SCORE_ROWS):
        rows = slice(start, start + _SCORE_ROWS)
        ref_lp = log_softmax(reference[rows].astype(np.float64))
        cand_lp = log_softmax(candidate[rows].astype(np.float64))
        index = np.arange(len(ref_lp))
        picked = targets[rows]
        parts.append(
            _Scores(
                agree=ref_lp.argmax(-1) == cand_lp.argmax(-1),
                kl=np.sum(np.exp(ref_lp) * (ref_lp - cand_lp), axis=-1),
                dlogprob=np.abs(ref_lp[index, picked] - cand_lp[index, picked]),
            )
        )
    return _Scores.concat(parts)


def compare_logits(
    reference: np.ndarray, candidate: np.ndarray, targets: np.ndarray
) -> FidelityReport:
    """Fidelity of ``candidate`` to ``reference`` (both [positions, vocab]) on ``targets``."""
    return _score(reference, candidate, targets).report()


def _feeds(session: Any, ids: list[int], room: int = 0) -> dict[str, np.ndarray]:
    """A first run's feeds. Graphs that write the KV in place at ``position_ids`` (the fused
    graph, ``fused.SCATTER_IN_PLACE``) get past buffers with room for the prompt and ``room``
    tokens more; the others an empty past that their present grows from."""
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
            heads, head_dim = spec.shape[1], spec.shape[3]  # int8 values: head_dim + 4
            dtype = {"tensor(float16)": np.float16, "tensor(int8)": np.int8}.get(spec.type)
            feeds[spec.name] = np.zeros((1, heads, width, head_dim), dtype=dtype or np.float32)
        elif spec.name == LOGITS_TO_KEEP:
            feeds[spec.name] = np.zeros(1, np.int64)  # every position
    return feeds


def full_sequence_logits(session: Any, ids: list[int]) -> np.ndarray:
    """Logits for every position of ``ids`` in one forward pass with an empty KV cache."""
    (logits,) = session.run(["logits"], _feeds(session, ids))
    return logits[0].astype(np.float32, copy=False)


def logits_at(session: Any, ids: list[int], positions: np.ndarray) -> np.ndarray:
    """float32 logits [len(positions), vocab] at ascending ``positions`` of one forward pass
    over ``ids``. Graphs with a ``num_logits_to_keep`` input (the fused ones) compute the LM
    head from the first of them on only: the same numbers (its rows do not depend on how many
    there are, docs/concepts/determinism.md), less time and memory for prompts."""
    feeds = _feeds(session, ids)
    first = int(positions[0]) if len(positions) else 0
    settable = {i.name for i in (*session.get_inputs(), *session.get_overridable_initializers())}
    if first and LOGITS_TO_KEEP in settable:
        feeds[LOGITS_TO_KEEP] = np.array([len(ids) - first], np.int64)
    else:
        first = 0
    (logits,) = session.run(["logits"], feeds)
    return logits[0][np.asarray(positions) - first].astype(np.float32, copy=False)


def greedy_continuation(
    session: Any, ids: list[int], max_new: int, stop_ids: set[int]
) -> list[int]:
    """The session's greedy tokens after ``ids`` (batch 1, KV cache fed back), eos included.

    The KV cache stays in ONNX Runtime's buffers from step to step (OrtValues): the same
    inputs as numpy copies would give, without copying a growing cache in and out each step.
    """
    from onnxruntime import OrtValue

    pasts = [i.name for i in session.get_inputs() if i.name.startswith("past_key_values")]
    presents = [name.replace("past_key_values.", "present.") for name in pasts]
    names = {i.name for i in session.get_inputs()}
    feeds = {
        k: OrtValue.ortvalue_from_numpy(v) for k, v in _feeds(session, ids, room=max_new).items()
    }
    keep = {k: v for k, v in feeds.items() if k == LOGITS_TO_KEEP}
    out: list[int] = []
    length = len(ids)
    for _ in range(max_new):
        logits, *kv = session.run_with_ort_values(["logits", *presents], feeds)
        token = int(np.argmax(logits.numpy()[0, -1]))
        out.append(token)
        if token in stop_ids:
            break
        length += 1
        feeds = {**dict(zip(pasts, kv, strict=True)), **keep}
        steps = {"input_ids": np.array([[token]], np.int64)}
        if "attention_mask" in names:
            steps["attention_mask"] = np.ones((1, length), np.int64)
        if "position_ids" in names:
            steps["position_ids"] = np.array([[length - 1]], np.int64)
        feeds.update({k: OrtValue.ortvalue_from_numpy(v) for k, v in steps.items()})
    return out


# KV bytes the rows decoded together may hold: a 0.6B model's 14 samples in one run held 280 MB
# more than one at a time (prepare's peak RSS 1.50 -> 1.68 GB); rows of like lengths share runs
ROWS_KV_BYTES = 64 << 20


def greedy_continuations(
    session: Any, prompts: list[list[int]], max_new: int, stop_ids: set[int]
) -> list[list[int]]:
    """Each prompt's ``greedy_continuation``, the same tokens. Graphs that write the KV in
    place (``SCATTER_IN_PLACE``, the fused ones) decode prompts of like lengths together, as
    the rows of one run (at most ``ROWS_KV_BYTES`` of KV a run): a batch-1 step streams every
    weight for one token, so one sample at a time took most of a 0.6B prepare's candidate
    time (benchmarks/README.md). Their rows are the bits each gets alone
    (docs/concepts/determinism.md: the engine batches requests the same way, a prompt's
    prefill alone, then one step for every row); other graphs go one at a time."""
    layout = session.get_modelmeta().custom_metadata_map.get(KV_LAYOUT)
    if layout != SCATTER_IN_PLACE or max_new < 1:
        return [greedy_continuation(session, ids, max_new, stop_ids) for ids in prompts]
    column = 0  # bytes of one KV column of one row, every layer's
    for spec in session.get_inputs():
        if spec.name.startswith("past_key_values"):
            size = {"tensor(float16)": 2, "tensor(int8)": 1}.get(spec.type, 4)
            column += spec.shape[1] * spec.shape[3] * size
    groups: list[list[int]] = [[]]
    for i in sorted(range(len(prompts)), key=lambda i: len(prompts[i])):
        group = groups[-1]  # sorted: a group's widest row is the one joining it
        if group and (len(group) + 1) * (len(prompts[i]) + max_new) * column > ROWS_KV_BYTES:
            groups.append(group := [])
        group.append(i)
    out: list[list[int]] = [[] for _ in prompts]
    for group in filter(None, groups):
        rows = _rows(session, [prompts[i] for i in group], max_new, stop_ids)
        for i, tokens in zip(group, rows, strict=True):
            out[i] = tokens
    return out


def _rows(
    session: Any, prompts: list[list[int]], max_new: int, stop_ids: set[int]
) -> list[list[int]]:
    """``greedy_continuations`` of ``prompts`` as the rows of one run (in-place KV graphs)."""
    from onnxruntime import OrtValue

    pasts = [i.name for i in session.get_inputs() if i.name.startswith("past_key_values")]
    presents = [name.replace("past_key_values.", "present.") for name in pasts]
    width = max(map(len, prompts)) + max_new  # every row's prompt and continuation fit
    buffers: list[np.ndarray] = []
    firsts: list[int] = []
    vocab = 0
    for row, ids in enumerate(prompts):  # each prompt alone, its KV then copied into its row
        feeds = _feeds(session, ids, room=0)
        feeds[LOGITS_TO_KEEP] = np.ones(1, np.int64)  # the last position's logits only
        logits, *kv = session.run(["logits", *presents], feeds)
        firsts.append(int(np.argmax(logits[0, -1])))
        vocab = logits.shape[-1]
        if not buffers:
            buffers = [
                np.zeros((len(prompts), *a.shape[1:2], width, a.shape[3]), a.dtype) for a in kv
            ]
        for buffer, a in zip(buffers, kv, strict=True):
            buffer[row, :, : len(ids)] = a[0]
        del kv
    binding = session.io_binding()
    values = [OrtValue.ortvalue_from_numpy(b) for b in buffers]  # written in place each step
    for past, present, value in zip(pasts, presents, values, strict=True):
        binding.bind_ortvalue_input(past, value)
        binding.bind_ortvalue_output(present, value)
    logits = np.empty((len(prompts), 1, vocab), np.float32)
    binding.bind_ortvalue_output("logits", OrtValue.ortvalue_from_numpy(logits))
    out = [[token] for token in firsts]
    lengths = np.array([len(ids) for ids in prompts], np.int64)
    keep = np.ones(1, np.int64)
    while True:
        going = [
            i
            for i, tokens in enumerate(out)
            if len(tokens) < max_new and tokens[-1] not in stop_ids
        ]
        if not going:
            return out
        # every row steps (a finished one too: its row is its own, and dropping it would
        # move the others' buffers), only the unfinished take their token
        last = np.array([[tokens[-1]] for tokens in out], np.int64)
        positions = (lengths + np.array([len(t) for t in out]) - 1)[:, None]
        for name, value in (
            ("input_ids", last),
            ("position_ids", positions),
            (LOGITS_TO_KEEP, keep),
        ):
            binding.bind_cpu_input(name, value)
        session.run_with_iobinding(binding)
        for i in going:
            out[i].append(int(np.argmax(logits[i, -1])))


def _stop_ids(tokenizer: Any) -> set[int]:
    eos = getattr(tokenizer, "eos_token_id", None)
    return {int(eos)} if eos is not None else set()


# An ONNX file, or a function from a list of (ids, positions) to the logits at those
# positions of each [len(positions), vocab], in order (all texts at once: a reference that
# runs one layer at a time over every text, ``layered.py``, needs them together).
Reference = Path | Callable[[list[tuple[list[int], np.ndarray]]], Iterable[np.ndarray]]


def measure_fidelity(
    reference_model: Reference,
    candidate_model: Path,
    tokenizer: Any,
    *,
    samples: tuple[Sample, ...] = FIDELITY_SET,
    greedy_tokens: int = GREEDY_TOKENS,
    reference: str = "fp32",
) -> FidelityReport:
    """Teacher-forced comparison of a candidate ONNX file with a reference (an ONNX file, or a
    function giving the logits at given positions of token lists: PyTorch itself) on
    reference and greedy continuations; ``reference`` names it in the report."""
    import onnxruntime as ort

    texts = [reference_spans(tokenizer, s) for s in samples]
    if isinstance(reference_model, Path) and os.path.samefile(reference_model, candidate_model):
        # the fp32 recipe is the export
        agree = np.ones(sum(e - s for _, spans in texts for s, e in spans), bool)
        zeros = np.zeros(len(agree))
        exact = _Scores(agree, zeros, zeros)
        exact_text = {"reference": exact.report(reference=reference).as_dict()}
        return exact.report(by_text=exact_text, reference=reference)

    # The two models take turns, one loaded at a time (prepare's peak memory: the fp32
    # reference alone is ~0.8 GB resident for the bundled model): the candidate first (its
    # greedy continuations, then its logits at every scored position, kept in a scratch file
    # beside it), then the reference. Each logit is what a side-by-side run gives.
    def session(path: Path) -> Any:
        options = ort.SessionOptions()
        options.log_severity_level = 3
        # No arena: each run's activations go back to the system; how buffers are allocated
        # changes no number.
        options.enable_cpu_mem_arena = False
        options = kernels.for_model(options, path)  # our operators, if the graph has them
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    cand = session(candidate_model)
    scored: dict[str, list[tuple[list[int], np.ndarray]]] = {"reference": [], "greedy": []}
    for ids, spans in texts:  # position p predicts token p + 1: the logits before each span
        scored["reference"].append(
            (ids, np.concatenate([np.arange(s - 1, e - 1) for s, e in spans]))
        )
    prompts = [
        render_ids(tokenizer, [dict(m) for m in sample.messages[:-1]], prompt=True)
        for sample in samples
    ]
    continuations = greedy_continuations(cand, prompts, greedy_tokens, _stop_ids(tokenizer))
    for prompt, new in zip(prompts, continuations, strict=True):
        scored["greedy"].append(
            (prompt + new, np.arange(len(prompt) - 1, len(prompt) + len(new) - 1))
        )
    with tempfile.TemporaryFile(dir=Path(candidate_model).parent) as cache:
        for kind in scored.values():
            for ids, positions in kind:
                cache.write(logits_at(cand, ids, positions).tobytes())
        del cand
        trim_heap()  # the candidate's weights, before the reference's
        every = [text for kind in scored.values() for text in kind]
        references: Iterator[np.ndarray]
        if isinstance(reference_model, Path):
            ref = session(reference_model)
            references = (logits_at(ref, ids, positions) for ids, positions in every)
        else:
            references = iter(reference_model(every))
        cache.seek(0)
        by_text: dict[str, _Scores] = {}
        for name, kind in scored.items():
            parts = []
            for ids, positions in kind:
                a = np.asarray(next(references), np.float32)
                b = np.fromfile(cache, np.float32, a.size).reshape(a.shape)
                parts.append(_score(a, b, np.asarray(ids, np.int64)[positions + 1]))
            by_text[name] = _Scores.concat(parts)
    return _Scores.concat(list(by_text.values())).report(
        by_text={n: s.report(reference=reference).as_dict() for n, s in by_text.items()},
        reference=reference,
    )
