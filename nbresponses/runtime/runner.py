"""One ONNX Runtime session and the single call the scheduler makes on it: run tokens, get logits.

Session settings are tuned for decode on a CPU: one intra-op thread per physical core (hyper-
threads only contend for the same vector units), sequential execution, full graph optimisation.
Inputs and outputs travel as OrtValues (`run_with_ort_values`), so the KV cache produced by one
step is fed to the next without passing through numpy.

Graphs that mark their KV layout as end-padded and in place (the fused graph: GroupQueryAttention
reads each row's length from the mask and writes the new column into the past buffer when past
and present are one tensor) decode through an IOBinding that binds each KV buffer as both input
and output; the bindings are kept between steps and only the ids, mask and positions are re-bound
(see ``kv.EndPaddedKV``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from nbresponses.models import kernels
from nbresponses.models.cpu import physical_cores
from nbresponses.models.fused import (  # the graph builder's names
    END_PADDED_IN_PLACE,
    KV_LAYOUT,
    LOGITS_TO_KEEP,
    MAX_POSITIONS,
    SCATTER_IN_PLACE,
)
from nbresponses.runtime.kv import KVLayout


def session_options(threads: int | None = None) -> ort.SessionOptions:
    # Not ``session.set_denormal_as_zero``: it looked 4-5% faster on random KV but made no
    # difference in the engine (A/B, 3 rounds), and ONNX Runtime sets the flags on the thread
    # that creates the session and leaves them set: a notebook's main thread would silently
    # flush every later subnormal of the user's.
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or physical_cores()
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    # The graph's threads spin while a run lasts (a step's ~265 nodes each wake them) but stop
    # as it returns: a spinning thread held the other core through the per-row logprobs
    # between runs, which two threads then computed no faster than one (2,940 scored tokens'
    # statistics: 118-126 ms either way, 69-72 with this), and through the notebook's own
    # Python. Decode steps measured level with it (benchmarks/README.md).
    options.add_session_config_entry("session.force_spinning_stop", "1")
    return options


class OnnxRunner:
    """The exported causal LM: ``run(ids, mask, positions, past) -> (last logits, present)``."""

    def __init__(self, model_path: str | os.PathLike[str], *, threads: int | None = None) -> None:
        self.model_path = Path(model_path)
        options = kernels.for_model(session_options(threads), self.model_path)
        # the graph's threads; between runs the per-row logprobs may take as many
        self.threads: int = options.intra_op_num_threads
        # A model that uses our operators has their library: its logprobs, ranks and entropies
        # come from its compiled core (``sampling.token_logprob``), the same numbers ~3x faster
        # than numpy's. Decided by the model file, so a model's numbers never change source.
        self.token_stats: kernels.TokenStats | None = (
            kernels.token_stats() if kernels.uses_kernels(self.model_path) else None
        )
        self.session = ort.InferenceSession(
            str(self.model_path), options, providers=["CPUExecutionProvider"]
        )
        self.layout = KVLayout.from_session(self.session)
        self._outputs = ["logits", *self.layout.present_names]
        self.vocab_size = int(self.session.get_outputs()[0].shape[-1])
        metadata = self.session.get_modelmeta().custom_metadata_map
        # Older fused graphs (left padding with an attention bias) lack the mark: they run one
        # row at a time (``kv.SeparateKV``), which is exact for any graph.
        layout = metadata.get(KV_LAYOUT)
        self.kv_in_place = layout in (END_PADDED_IN_PLACE, SCATTER_IN_PLACE)
        # Graphs whose attention gives a token the same numbers whatever the step shape
        # (``models/attention.py``): several new tokens per row in a batched step, and KV
        # computed by decode steps equal to what a prefill computes. Every run binds the KV
        # buffers in place; the past buffers must have room for the new tokens.
        self.exact_steps = layout == SCATTER_IN_PLACE
        # ... and of those, the ones whose attention is the standard operators' read every
        # column of the buffers in every step (our KVAttention reads a token's own columns):
        # spare columns cost them time, so their buffers keep fewer (``kv.SCATTER_HEADROOM``)
        self.reads_every_column = self.exact_steps and not kernels.uses_kernels(
            self.model_path, "KVAttention"
        )
        # Fused graphs say how many positions their rotary tables cover (long-rope models stop
        # at the original context, where they are exact): the engine's context stops there too.
        self.max_positions = int(metadata[MAX_POSITIONS]) if MAX_POSITIONS in metadata else None
        # Some exports (gpt-oss) derive positions from the attention mask and take no position_ids.
        inputs = {i.name for i in self.session.get_inputs()}
        self._inputs = tuple(
            n for n in ("input_ids", "attention_mask", "position_ids") if n in inputs
        )
        # Graphs that can compute the LM head for the last position only (an input with a
        # default, which ONNX Runtime lists among the overridable initializers) are asked to.
        overridable = {i.name for i in self.session.get_overridable_initializers()}
        self.last_logits_only = LOGITS_TO_KEEP in overridable | inputs
        # the KV buffers' bindings, one per logits shape (a step's rows x positions kept)
        self._bindings: dict[tuple[int, ...], tuple[Any, np.ndarray]] = {}
        self._bound_past: list[Any] | None = None
        self._logits = np.empty((0, 0, self.vocab_size), np.float32)
        self._logits_memory = np.empty(0, np.float32)
        self.run(*_warmup_inputs(self.layout))  # first-run allocations: not in a user's TTFT

    def run(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        position_ids: np.ndarray,
        past: list[Any],
        *,
        in_place: bool = False,
        position: int | None = -1,
        keep: int = 0,
    ) -> tuple[np.ndarray, list[Any]]:
        """Logits of one position of every row ([B, V] float32; the last one by default, or
        ``position`` counted from the end, -1 or -2; with ``position=None``, the last ``keep``
        positions of one row, [keep, V], or with ``keep`` 0 every position) and the present KV.
        Positions not kept skip the LM head (a scoring run needs no logits before the first
        scored token); the kept ones are the same bits.

        ``in_place`` (graphs with ``kv_in_place`` only; one new token per row): ``past`` are
        OrtValue buffers with room for the new columns; they are updated and returned as the
        present.
        """
        if in_place:
            logits, present = self._run_in_place(input_ids, attention_mask, position_ids, past)
            return logits[:, -1, :], present
        if self.exact_steps:
            return self._run_with_room(input_ids, position_ids, past, position, keep)
        given = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
        }
        feeds = {name: _ortvalue(given[name]) for name in self._inputs}
        if self.last_logits_only:
            kept = keep if position is None else -position  # 0: every position
            feeds[LOGITS_TO_KEEP] = _ortvalue(np.array([kept], np.int64))
        for name, value in zip(self.layout.past_names, past, strict=True):
            feeds[name] = _ortvalue(value)
        outputs = self.session.run_with_ort_values(self._outputs, feeds)
        full = outputs[0].numpy()
        logits = full[0] if position is None else full[:, position, :]
        return np.ascontiguousarray(logits, dtype=np.float32), list(outputs[1:])

    def _reused_logits(self, shape: tuple[int, ...]) -> np.ndarray:
        """A logits buffer of ``shape`` over memory reused between runs (grown, never shrunk;
        an in-place binding made on smaller memory keeps its own view of it alive)."""
        count = int(np.prod(shape))
        if self._logits_memory.size < count:
            self._logits_memory = np.empty(count, np.float32)
        return self._logits_memory[:count].reshape(shape)

    def _run_in_place(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        position_ids: np.ndarray,
        past: list[Any],
        keep: int = 0,
    ) -> tuple[np.ndarray, list[Any]]:
        if not self.kv_in_place:
            raise ValueError(f"{self.model_path} does not support in-place KV")
        # IOBinding cannot bind an overridable initializer: on graphs without the input,
        # ``num_logits_to_keep`` keeps its default (all positions), which for a decode step is
        # the one position anyway.
        kept = keep if self.exact_steps and 0 < keep < input_ids.shape[1] else input_ids.shape[1]
        shape = (input_ids.shape[0], kept, self.vocab_size)
        if past is not self._bound_past:
            self._bindings, self._bound_past = {}, past
        found = self._bindings.get(shape)
        if found is None:
            # Binding the KV buffers (60 on the bundled model, in and out) again cost 0.2-0.5
            # ms a step where widths alternate, as speculation's do (benchmarks/README.md): a
            # binding is kept for each shape the buffers see (a handful) until they change.
            binding = self.session.io_binding()
            for name, out, value in zip(
                self.layout.past_names, self.layout.present_names, past, strict=True
            ):
                binding.bind_ortvalue_input(name, value)
                binding.bind_ortvalue_output(out, value)
            # Logits land in a buffer of ours, reused while the batch keeps its shape: no
            # allocation and no copy per step (3 MB a step at 16 rows). Steps of other widths
            # (drafts verified) reuse its memory too: fresh pages would cost a fault each.
            # Callers read a row before the next run overwrites it.
            logits = self._reused_logits(shape)
            binding.bind_ortvalue_output("logits", ort.OrtValue.ortvalue_from_numpy(logits))
            found = self._bindings[shape] = (binding, logits)
        binding, self._logits = found
        given = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
        }
        feeds = [np.ascontiguousarray(given[name]) for name in self._inputs]
        for name, value in zip(self._inputs, feeds, strict=True):
            binding.bind_cpu_input(name, value)
        if self.exact_steps:
            feeds.append(np.array([kept % input_ids.shape[1]], np.int64))  # 0: every position
            binding.bind_cpu_input(LOGITS_TO_KEEP, feeds[-1])
        self.session.run_with_iobinding(binding)  # ``feeds`` stays alive until here
        return self._logits, past

    def run_steps(
        self, input_ids: np.ndarray, position_ids: np.ndarray, past: list[Any], keep: int = 0
    ) -> np.ndarray:
        """Several new tokens per row into in-place buffers (``exact_steps`` graphs only): the
        logits of every position, [B, S, V], or of the last ``keep``, [B, keep, V], valid until
        the next run."""
        if not self.exact_steps:
            raise ValueError(f"{self.model_path} cannot run several tokens per row in a batch")
        logits, _ = self._run_in_place(
            input_ids, np.empty((0, 0), np.int64), position_ids, past, keep
        )
        return logits

    def _run_with_room(
        self,
        input_ids: np.ndarray,
        position_ids: np.ndarray,
        past: list[Any],
        position: int | None,
        keep: int = 0,
    ) -> tuple[np.ndarray, list[Any]]:
        """A run of an ``exact_steps`` graph on a past without room: copy it into buffers with
        room for the new tokens, which the graph then fills in place (they are the present)."""
        batch, count = input_ids.shape
        buffers = []
        for value in past:
            array = value if isinstance(value, np.ndarray) else value.numpy()
            kv_heads, width, head_dim = array.shape[1:]
            buffer = np.zeros((batch, kv_heads, width + count, head_dim), array.dtype)
            buffer[:, :, :width] = array
            buffers.append(buffer)
        binding = self.session.io_binding()
        if position is None:
            # Every position's logits (a scoring run: 50 MB at 256 tokens) land in a buffer of
            # ours, reused from run to run: a fresh output, copied out by ``.numpy()``, cost a
            # page fault per 4 KiB and a copy (benchmarks/README.md). The caller reads them
            # before its next run (``Scheduler._extend``).
            keep = keep if 0 < keep < count else 0
            full = self._reused_logits((batch, keep or count, self.vocab_size))
            binding.bind_ortvalue_output("logits", ort.OrtValue.ortvalue_from_numpy(full))
        else:
            binding.bind_output("logits")  # first: ``get_outputs()`` lists them in binding order
        present = [ort.OrtValue.ortvalue_from_numpy(b) for b in buffers]
        for name, out, value in zip(
            self.layout.past_names, self.layout.present_names, present, strict=True
        ):
            binding.bind_ortvalue_input(name, value)
            binding.bind_ortvalue_output(out, value)
        keep = keep if position is None else -position  # 0: every position
        feeds = {
            "input_ids": np.ascontiguousarray(input_ids, np.int64),
            "position_ids": np.ascontiguousarray(position_ids, np.int64),
            LOGITS_TO_KEEP: np.array([keep], np.int64),
        }
        for name, value in feeds.items():
            binding.bind_cpu_input(name, value)
        self.session.run_with_iobinding(binding)
        if position is None:
            return full[0], buffers
        logits = binding.get_outputs()[0].numpy()[:, position, :]
        # the arrays, not the OrtValues: an OrtValue over numpy memory does not own it, and a
        # view taken with ``.numpy()`` would outlive the array once the OrtValue is dropped
        return np.ascontiguousarray(logits, dtype=np.float32), buffers


def _warmup_inputs(layout: KVLayout) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[Any]]:
    ids = np.zeros((1, 2), np.int64)
    return ids, np.ones((1, 2), np.int64), np.arange(2, dtype=np.int64)[None], layout.empty()


def _ortvalue(value: Any) -> ort.OrtValue:
    if isinstance(value, ort.OrtValue):
        return value
    return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(value))
