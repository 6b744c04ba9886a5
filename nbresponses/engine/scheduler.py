"""Continuous batching in one worker thread: admit, prefill, decode one step, emit, repeat.

Each iteration (1) drops cancelled rows, (2) admits waiting requests in FIFO order while the batch
size and KV budget allow, prefilling each one alone (reusing cached prefix KV) and merging it into
the running batch with left padding, then (3) runs one decode step for every row. Finished rows
leave at once. ONNX Runtime releases the GIL while it computes, so the asyncio loop that consumes
the steps (a notebook kernel) stays responsive; steps cross to it via ``call_soon_threadsafe``.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from nbresponses.engine import sampling
from nbresponses.engine.kv import BatchKV, RowKV
from nbresponses.engine.prefix_cache import PrefixCache
from nbresponses.engine.runner import OnnxRunner
from nbresponses.engine.types import GenerationStats, SamplingParams, Step, TokenLogprob

PREFILL_CHUNK = 512  # prompt tokens per prefill run: bounds attention and logits memory

_ids = itertools.count(1)


@dataclass(eq=False)
class Request:
    """One generation as the worker sees it. ``sink`` must be safe to call from the worker."""

    prompt: tuple[int, ...]
    params: SamplingParams
    stats: GenerationStats
    sink: Callable[[Step], None]
    budget_tokens: int  # prompt + the most tokens it may generate (KV reservation)
    id: int = field(default_factory=lambda: next(_ids))
    rng: np.random.Generator = field(init=False)
    generated: list[int] = field(default_factory=list)
    cancelled: bool = False
    done: bool = False
    submitted_at: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        self.rng = sampling.make_rng(self.params)


class Scheduler:
    """Owns the runner, the batch KV and the prefix cache; only its thread touches them."""

    def __init__(
        self,
        runner: OnnxRunner,
        *,
        stop_ids: Sequence[int],
        context_length: int,
        max_batch_size: int,
        kv_budget_bytes: int,
        prefix_cache: PrefixCache,
    ) -> None:
        self.runner = runner
        self.stop_ids = frozenset(int(t) for t in stop_ids)
        self.context_length = context_length
        self.max_batch_size = max_batch_size
        self.kv_budget_bytes = kv_budget_bytes
        self.prefix_cache = prefix_cache
        self.kv = BatchKV(runner.layout, in_place=runner.kv_in_place)
        self.rows: list[Request] = []
        self.steps = 0  # decode steps run (for tests and stats)
        self._waiting: deque[Request] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="nbresponses-engine", daemon=True)
        self._thread.start()

    # -- called from any thread ---------------------------------------------------------------

    def submit(self, request: Request) -> None:
        with self._cond:
            if self._stopping:
                raise RuntimeError("the engine is closed")
            self._waiting.append(request)
            self._cond.notify()

    def cancel(self, request: Request) -> None:
        request.cancelled = True
        with self._cond:
            self._cond.notify()

    def close(self, timeout: float | None = None) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    # -- the worker ---------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._stopping or self._waiting or self.rows):
                    self._cond.wait()
                if self._stopping:
                    break
            self._drop_cancelled()
            self._admit()
            if self.rows:
                self._decode()
        for request in [*self.rows, *self._waiting]:
            self._finish(request, Step((), finish_reason="cancelled"))
        self.rows.clear()
        self._waiting.clear()

    def _drop_cancelled(self) -> None:
        gone = [i for i, r in enumerate(self.rows) if r.cancelled]
        for i in gone:
            self._finish(self.rows[i], Step((), finish_reason="cancelled"))
        self._remove(gone)

    def _fits(self, request: Request, pending: list[Request]) -> bool:
        """Batch size and KV budget (rows x the longest reservation, as left padding costs)."""
        rows = [*self.rows, *pending]
        if not rows:
            return True  # alone it always runs: a large request must not wait forever
        if len(rows) >= self.max_batch_size:
            return False
        longest = max(request.budget_tokens, *(r.budget_tokens for r in rows))
        need = (len(rows) + 1) * longest * self.runner.layout.bytes_per_token
        return need <= self.kv_budget_bytes

    def _admit(self) -> None:
        """Prefill every waiting request that fits, then merge them into the batch at once."""
        joined: list[tuple[Request, RowKV]] = []
        try:
            while True:
                with self._cond:
                    if not self._waiting:
                        return
                    request = self._waiting[0]
                    if not (request.cancelled or self._fits(request, [r for r, _ in joined])):
                        return  # FIFO: later requests wait behind it, nobody starves
                    self._waiting.popleft()
                if request.cancelled:
                    self._finish(request, Step((), finish_reason="cancelled"))
                    continue
                try:
                    row = self._prefill(request)
                except Exception as exc:  # one bad request must not stop the others
                    self._finish(request, Step((), finish_reason="error", error=_describe(exc)))
                    continue
                if row is not None:
                    joined.append((request, row))
        finally:
            self.kv.add_rows([row for _, row in joined])
            self.rows.extend(request for request, _ in joined)

    def _prefill(self, request: Request) -> RowKV | None:
        """Run the prompt alone and send its first token. Returns its KV row, or None when the
        request already finished."""
        start = time.perf_counter()
        stats = request.stats
        stats.timings["queued_s"] = start - request.submitted_at
        prompt = request.prompt
        cached, past = self.prefix_cache.lookup(prompt)
        stats.prompt_tokens, stats.cached_tokens = len(prompt), cached
        past_values: list = past if past is not None else self.runner.layout.empty()[:]
        past_values = [a[None] if a.ndim == 3 else a for a in past_values]
        logits = None
        for begin in range(cached, len(prompt), PREFILL_CHUNK):
            chunk = np.asarray(prompt[begin : begin + PREFILL_CHUNK], np.int64)[None]
            end = begin + chunk.shape[1]
            mask = np.ones((1, end), np.int64)
            positions = np.arange(begin, end, dtype=np.int64)[None]
            logits, past_values = self.runner.run(chunk, mask, positions, past_values)
        assert logits is not None
        row: RowKV = [v.numpy()[0] for v in past_values]
        stats.timings["prefill_s"] = time.perf_counter() - start
        if self._emit(request, logits[0]):
            self._store_prefix(request, row)
            return None
        return row

    def _decode(self) -> None:
        ids = np.array([[r.generated[-1]] for r in self.rows], np.int64)
        try:
            logits, presents = self.runner.run(
                ids,
                self.kv.attention_mask(),
                self.kv.positions(),
                self.kv.inputs(),
                in_place=self.kv.in_place,
            )
        except Exception as exc:  # the batch is lost; fail its rows, keep serving new ones
            for request in self.rows:
                self._finish(request, Step((), finish_reason="error", error=_describe(exc)))
            self._remove(list(range(len(self.rows))))
            return
        self.kv.advance(presents)
        self.steps += 1
        finished = []
        for i, request in enumerate(self.rows):
            if request.cancelled or self._emit(request, logits[i]):
                finished.append(i)
                if not request.cancelled:
                    self._store_prefix(request, self.kv.row(i))
                else:
                    self._finish(request, Step((), finish_reason="cancelled"))
        self._remove(finished)

    def _remove(self, indices: list[int]) -> None:
        if indices:
            self.kv.remove(indices)
            drop = set(indices)
            self.rows = [r for i, r in enumerate(self.rows) if i not in drop]

    def _emit(self, request: Request, logits: np.ndarray) -> bool:
        """Choose a token, send its Step; True when the request is finished."""
        params = request.params
        try:
            token = sampling.choose(logits, params, request.rng)
            logprob: tuple[TokenLogprob, ...] | None = None
            if params.logprobs or params.top_logprobs:
                logprob = (sampling.token_logprob(logits, token, params.top_logprobs),)
        except Exception as exc:
            self._finish(request, Step((), finish_reason="error", error=_describe(exc)))
            return True
        request.generated.append(token)
        stats = request.stats
        stats.output_tokens = len(request.generated)
        if stats.first_token_time is None:
            stats.first_token_time = time.perf_counter()
        reason = None
        if token in self.stop_ids or token in params.stop_token_ids:
            reason = "stop"
        elif (
            len(request.generated) >= params.max_tokens
            or len(request.prompt) + len(request.generated) >= self.context_length
        ):
            reason = "length"
        step = Step((token,), logprob, finish_reason=reason)
        if reason:
            self._finish(request, step)
        else:
            self._send(request, step)
        return reason is not None

    def _store_prefix(self, request: Request, row: RowKV) -> None:
        """Keep prompt + output (minus the last token, whose KV was never computed)."""
        tokens = request.prompt + tuple(request.generated[:-1])
        if row and row[0].shape[1] == len(tokens):
            self.prefix_cache.store(tokens, row)

    def _finish(self, request: Request, step: Step) -> None:
        if not request.done:
            request.done = True
            request.stats.timings["total_s"] = time.perf_counter() - request.submitted_at
            self._send(request, step)

    def _send(self, request: Request, step: Step) -> None:
        try:
            request.sink(step)
        except RuntimeError:  # the consumer's event loop is gone
            request.cancelled = True


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
