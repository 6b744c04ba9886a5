"""PyTorch forward passes over many texts, whole or one decoder layer at a time.

Prepare runs the fp32 source model over two sets of texts: the calibration set (``fused-int8``'s
activation peaks) and the fidelity set (the reference logits every recipe is measured
against). A model loaded whole runs each text as ``model(...)``. A streamed model
(``streamed.py``: a skeleton without weights) runs the same modules in another order: every
text through layer 0 with only layer 0's weights in memory, then every text through layer 1,
and so on, so at most one layer (plus the embedding, final norm and LM head) is ever loaded.

The numbers are the whole model's: each layer gets the arguments ``model(...)`` gives it,
recorded from a pass where the layers are stand-ins (masks and rotary tables do not depend on
the layers' outputs), and the final norm, LM head and any soft-capping run in ``model(...)``
itself, its last layer standing in with the hidden states computed here.
``tests/models/test_streamed.py`` checks the logits bit for bit against ``model(...)``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from nbresponses.models.cpu import physical_cores

# (token ids, which logits to keep: a tensor of positions, or 0 for every position)
Text = tuple[list[int], Any]


@contextlib.contextmanager
def torch_threads() -> Iterator[None]:
    """One thread less than the cores: PyTorch's OpenMP threads wait for each other at every
    op, and one descheduled thread stalls them all (on 2 busy cores, measured: 300 tokens in
    1.5-2 s with 1 thread, 10-38 s with 2)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, min(threads, physical_cores() - 1)))
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def forward_all(
    model: Any,
    texts: Sequence[Text],
    tensors: Mapping[str, Any] | None = None,
    *,
    fewer_threads: bool = True,
) -> Iterator[np.ndarray]:
    """fp32 logits [kept positions, vocab] of each text, in order (teacher forcing, no cache).
    ``tensors``: the weights of a skeleton ``model`` (``streamed.SafetensorsWeights``), run
    layer by layer; None: ``model`` holds its weights and runs whole. Forward hooks on its
    modules see what they would see in ``model(...)`` (calibration). ``fewer_threads``:
    ``torch_threads`` (False: PyTorch's own count, as the calibration has always run)."""
    import torch

    threads = torch_threads() if fewer_threads else contextlib.nullcontext()
    with threads, torch.no_grad():
        if tensors is None:
            for ids, keep in texts:
                yield _logits(model, ids, keep)
        else:
            yield from _layered(model, texts, tensors)


def _logits(model: Any, ids: list[int], keep: Any) -> np.ndarray:
    import torch

    out = model(
        input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False, logits_to_keep=keep
    )
    return out.logits[0].float().numpy()


class _Captured(Exception):
    """Raised by the last stand-in layer: the arguments are recorded, the head is not needed."""


def _layered(model: Any, texts: Sequence[Text], tensors: Mapping[str, Any]) -> Iterator[np.ndarray]:
    layers = list(model.model.layers)
    names = {id(m): n for n, m in model.named_modules()}
    prefixes = [names[id(layer)] + "." for layer in layers]
    keys = list(model.state_dict(keep_vars=True))
    outside = [k for k in keys if not k.startswith(tuple(prefixes))]
    restore_outside = _materialize(model, outside, tensors)  # embedding, final norm, LM head
    try:
        hidden, calls = _record(model, layers, texts)
        tuples = [False] * len(layers)
        for i, (layer, prefix) in enumerate(zip(layers, prefixes, strict=True)):
            restore = _materialize(model, [k for k in keys if k.startswith(prefix)], tensors)
            try:
                for t, call in enumerate(calls):
                    out = layer(hidden[t], *call.args[i], **call.kwargs[i])
                    tuples[i] = isinstance(out, tuple)
                    hidden[t] = out[0] if tuples[i] else out
            finally:
                restore()
        for t, (ids, keep) in enumerate(texts):
            with _stand_ins(layers, tuples, final=hidden[t]):
                yield _logits(model, ids, keep)
    finally:
        restore_outside()


def _record(model: Any, layers: list[Any], texts: Sequence[Text]) -> tuple[list[Any], list[_Calls]]:
    """Each text's embedded input and the arguments ``model(...)`` gives each layer."""
    hidden: list[Any] = []
    calls: list[_Calls] = []
    for ids, keep in texts:
        recorded = _Calls(len(layers))
        for i, layer in enumerate(layers):
            layer.forward = recorded.stand_in(i)
        try:
            _logits(model, ids, keep)
        except _Captured:
            pass
        finally:
            for layer in layers:
                del layer.forward
        hidden.append(recorded.first)
        calls.append(recorded)
    return hidden, calls


class _Calls:
    """What one text's ``model(...)`` passes each layer besides the hidden states."""

    def __init__(self, layers: int) -> None:
        self.layers = layers
        self.first: Any = None  # the first layer's input: the embedded text
        self.args: list[tuple[Any, ...]] = []
        self.kwargs: list[dict[str, Any]] = []

    def stand_in(self, i: int) -> Any:
        def forward(hidden_states: Any, *rest: Any, **named: Any) -> Any:
            if i == 0:
                self.first = hidden_states
            self.args.append(rest)
            self.kwargs.append(named)
            if i == self.layers - 1:
                raise _Captured
            return hidden_states

        return forward


@contextlib.contextmanager
def _stand_ins(layers: list[Any], tuples: list[bool], *, final: Any) -> Iterator[None]:
    """Layers that pass their input on (the last one: ``final``), shaped as the real ones."""

    def stand_in(i: int) -> Any:
        def forward(hidden_states: Any, *rest: Any, **named: Any) -> Any:
            out = final if i == len(layers) - 1 else hidden_states
            return (out,) if tuples[i] else out

        return forward

    for i, layer in enumerate(layers):
        layer.forward = stand_in(i)
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward


def _materialize(model: Any, keys: list[str], tensors: Mapping[str, Any]) -> Any:
    """Give the parameters (and persistent buffers) named ``keys`` their weights, tied ones
    one shared tensor; returns the function that puts the empty ones back."""
    import torch

    saved: list[tuple[Any, str, bool, Any]] = []
    loaded: dict[str, Any] = {}
    for key in keys:
        owner, _, attr = key.rpartition(".")
        module = model.get_submodule(owner)
        is_param = attr in module._parameters
        old = module._parameters[attr] if is_param else module._buffers[attr]
        source = getattr(tensors, "aliases", {}).get(key, key)
        if source not in loaded:
            value = tensors[source]
            loaded[source] = torch.nn.Parameter(value, requires_grad=False) if is_param else value
        saved.append((module, attr, is_param, old))
        (module._parameters if is_param else module._buffers)[attr] = loaded[source]

    def restore() -> None:
        for module, attr, is_param, old in saved:
            (module._parameters if is_param else module._buffers)[attr] = old

    return restore
