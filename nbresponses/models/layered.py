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
import functools
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import islice
from typing import Any, TypeVar

import numpy as np

from nbresponses.models.cpu import physical_cores

# (token ids, which logits to keep: a tensor of positions, or 0 for every position)
Text = tuple[list[int], Any]


T = TypeVar("T")
R = TypeVar("R")


@contextlib.contextmanager
def texts_side_by_side() -> Iterator[ThreadPoolExecutor]:
    """A worker per physical core, each running its own text with every op on one thread.

    Why not PyTorch's threads: its OpenMP threads wait for each other at every op, and one
    descheduled thread stalls them all (on 2 busy cores, measured: 300 tokens in 1.5-2 s with 1
    thread, 10-38 s with 2), so the reference ran on one thread and left the other cores idle.
    Texts are independent: workers that never wait for each other use every core when the
    machine is quiet and degrade to a busy machine's share when it is not. One thread an op,
    as before on 2 cores, so a text's logits do not depend on the worker or its neighbours."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # this thread's ops (a layered model's head) and each worker's:
    pool = ThreadPoolExecutor(  # a new thread starts with OpenMP's default team, all cores
        physical_cores(), "nbr-reference", initializer=torch.set_num_threads, initargs=(1,)
    )
    try:
        yield pool
    finally:  # a consumer that stops early: the texts not started are not run
        pool.shutdown(wait=True, cancel_futures=True)
        torch.set_num_threads(threads)


def _in_order(
    pool: ThreadPoolExecutor, work: Callable[[T], R], items: Iterable[T], ahead: int
) -> Iterator[R]:
    """``work(item)`` for each item on the pool, yielded in order, at most ``ahead`` items
    started and not yet taken by the consumer (results are not all held at once; more than a
    worker each, so that a long text does not idle the others)."""
    todo = iter(items)
    pending: deque[Future[R]] = deque(pool.submit(work, item) for item in islice(todo, ahead))
    while pending:
        result = pending.popleft().result()
        pending.extend(pool.submit(work, item) for item in islice(todo, 1))
        yield result


def forward_all(
    model: Any,
    texts: Sequence[Text],
    tensors: Mapping[str, Any] | None = None,
    *,
    side_by_side: bool = True,
) -> Iterator[np.ndarray]:
    """fp32 logits [kept positions, vocab] of each text, in order (teacher forcing, no cache).
    ``tensors``: the weights of a skeleton ``model`` (``streamed.SafetensorsWeights``), run
    layer by layer; None: ``model`` holds its weights and runs whole. ``side_by_side``: texts
    on ``texts_side_by_side``'s workers (False: one after another on PyTorch's own threads, in
    the order given, as the calibration's forward hooks need). Every forward pass runs under
    ``torch.no_grad`` where it runs (``_logits``, ``_layered``): the mode is per thread."""
    if not side_by_side:
        if tensors is None:
            for ids, keep in texts:
                yield _logits(model, ids, keep)
        else:
            yield from _layered(model, texts, tensors, None)
        return
    with texts_side_by_side() as pool:
        if tensors is None:
            # texts started and not yet taken: a worker's each and two more, whatever the core
            # count (each is a text's logits, [kept positions, vocab]: 0.6 MB a position at
            # 150k words)
            ahead = physical_cores() + 2
            yield from _in_order(pool, lambda text: _logits(model, *text), texts, ahead)
        else:
            yield from _layered(model, texts, tensors, pool)


def _logits(model: Any, ids: list[int], keep: Any) -> np.ndarray:
    import torch

    with torch.no_grad():  # per thread: a worker does not inherit its caller's
        out = model(
            input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False, logits_to_keep=keep
        )
    return out.logits[0].float().numpy()


class _Captured(Exception):
    """Raised by the last stand-in layer: the arguments are recorded, the head is not needed."""


def _layered(
    model: Any,
    texts: Sequence[Text],
    tensors: Mapping[str, Any],
    pool: ThreadPoolExecutor | None,
) -> Iterator[np.ndarray]:
    """Every text through each layer in turn (its texts on ``pool``'s workers, if given), then
    each text's head in ``model(...)`` with the layers standing in (one text at a time: the
    stand-ins are the layers' own ``forward``)."""
    import torch

    layers = list(model.model.layers)
    names = {id(m): n for n, m in model.named_modules()}
    prefixes = [names[id(layer)] + "." for layer in layers]
    keys = list(model.state_dict(keep_vars=True))
    outside = [k for k in keys if not k.startswith(tuple(prefixes))]
    restore_outside = _materialize(model, outside, tensors)  # embedding, final norm, LM head
    try:
        hidden, calls = _record(model, layers, texts)
        tuples = [False] * len(layers)

        def through(i: int, t: int) -> Any:
            """Text ``t`` through layer ``i``."""
            with torch.no_grad():
                return layers[i](hidden[t], *calls[t].args[i], **calls[t].kwargs[i])

        apply = pool.map if pool else map  # every text's hidden states are kept anyway
        for i, prefix in enumerate(prefixes):
            restore = _materialize(model, [k for k in keys if k.startswith(prefix)], tensors)
            try:
                for t, out in enumerate(apply(functools.partial(through, i), range(len(calls)))):
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
