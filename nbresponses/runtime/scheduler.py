"""Continuous batching in one worker thread: admit, prefill, decode one step, emit, repeat.

Each iteration (1) drops cancelled rows, (2) admits waiting requests in FIFO order while the batch
size and KV budget allow, prefilling each one alone, shortest first (reusing cached prefix KV;
identical prompts admitted together are prefilled once), and merging them into the running
batch, then (3) runs one decode step for every row: one token each, or, when rows have drafts
that pay for a wider step (``speculation``), each row's last token plus its draft, verified at
once. Finished rows leave at once.
ONNX Runtime releases the GIL while it computes, so the asyncio loop that consumes the steps (a
notebook kernel) stays responsive; steps cross to it via ``call_soon_threadsafe``.

Exactness (docs/concepts/determinism.md): a request's tokens and logprobs depend on nothing but
the request. Three rules here keep it so, each answering a measured kernel behaviour:
- prefill runs have an even number of tokens (a dummy token is appended to an odd one; its
  logits and KV are dropped): ONNX Runtime's attention computes a lone query row of a prefill
  tile, as a one-row matmul does, with another summation order than a row among others;
- the prefix cache keeps only KV computed by prefill runs (prompts, and finished answers
  re-computed while the engine is idle), never the decode steps' KV, which the one-query decode
  kernel computed in yet another order; so a cached prefix equals what a cold prefill computes;
- decode batches keep each row's KV unshifted (``kv.EndPaddedKV``) or run rows alone
  (``kv.SeparateKV``).

Constrained rows (a grammar: ``SamplingParams.constraint``) share the batch with free ones. Each
decode step first hands the constrained rows' mask computation to a helper thread, runs the
model meanwhile, then masks each such row's logits (disallowed tokens to -inf) before choosing.
The mask depends on the row's own tokens alone, and logprobs are computed from the unmasked
logits, so a constrained row is as exact as a free one (``constraints.py``).
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nbresponses.runtime import sampling
from nbresponses.runtime.constraints import MaskWorker, RowConstraint
from nbresponses.runtime.kv import DecodingRows, EndPaddedKV, RowKV, SeparateKV
from nbresponses.runtime.prefix_cache import PrefixCache
from nbresponses.runtime.runner import OnnxRunner
from nbresponses.runtime.speculation import Drafter, step_width
from nbresponses.tokens.contract import (
    FinishReason,
    GenerationStats,
    SamplingParams,
    Step,
    TokenIdLogprob,
)

PREFILL_CHUNK = 256  # prompt tokens per prefill run (even): bounds attention and logits memory;
# with attention reading every column, smaller runs skip part of the masked triangle (450 / 1,000 /
# 2,000 tokens: 356 / 1,151 / 2,921 ms in runs of 256, 399 / 1,184 / 3,198 in runs of 512)
IDLE_CHUNK = 64  # tokens per run when re-computing a finished answer while idle (even)
SCORE_CHUNK = 256  # tokens per run of a scoring job (even): its logits are 192 KiB a token
IDLE_QUEUE = 8  # finished answers remembered for idle re-computation (newest kept)

_ids = itertools.count(1)


@dataclass(eq=False)
class Request:
    """One generation as the worker sees it. ``sink`` must be safe to call from the worker."""

    prompt: tuple[int, ...]
    params: SamplingParams
    stats: GenerationStats
    sink: Callable[[Step], None]
    budget_tokens: int  # prompt + the most tokens it may generate (KV reservation)
    score_from: int = 0  # > 0: a scoring job (logprobs of prompt[score_from:]), no generation
    id: int = field(default_factory=lambda: next(_ids))
    rng: np.random.Generator = field(init=False)
    constraint: RowConstraint | None = field(init=False, default=None)
    generated: list[int] = field(default_factory=list)
    drafter: Drafter | None = None  # speculation's n-gram index of prompt + generated
    cancelled: bool = False
    done: bool = False
    submitted_at: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        self.rng = sampling.make_rng(self.params)
        if self.params.constraint is not None and not self.params.forced_tokens:
            budget = self.budget_tokens - len(self.prompt)  # the most tokens it may generate
            self.constraint = RowConstraint(self.params.constraint(), budget)


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
        self.kv: DecodingRows
        if runner.kv_in_place:
            self.kv = EndPaddedKV(runner.layout, reads_every_column=runner.exact_steps)
        else:
            self.kv = SeparateKV(runner.layout)
        self.speculation = runner.exact_steps  # verify drafted tokens in a step (below)
        self.rows: list[Request] = []
        self.steps = 0  # decode steps run (for tests and stats)
        self._waiting: deque[Request] = deque()
        # finished requests' prompt + answer, to re-compute by prefill when idle (newest last)
        self._idle_work: deque[tuple[int, ...]] = deque(maxlen=IDLE_QUEUE)
        self._masks = MaskWorker()
        self._cond = threading.Condition()
        self._idle = threading.Event()  # set while the worker has nothing at all to do
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="nbresponses-engine", daemon=True)
        self._thread.start()

    # -- called from any thread ---------------------------------------------------------------

    def submit(self, request: Request) -> None:
        self.submit_many([request])

    def submit_many(self, requests: Sequence[Request]) -> None:
        """Queue requests at once: the next admission round sees them all (as many as fit),
        so identical prompts among them share one prefill (``_admit``)."""
        with self._cond:
            if self._stopping:
                raise RuntimeError("the engine is closed")
            self._waiting.extend(requests)
            self._idle.clear()
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
        self._masks.close()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until nothing runs, waits or is left to re-compute for the prefix cache."""
        return self._idle.wait(timeout)

    # -- the worker ---------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._stopping or self._waiting or self.rows or self._idle_work):
                    self._idle.set()
                    self._cond.wait()
                self._idle.clear()
                if self._stopping:
                    break
            self._drop_cancelled()
            self._admit()
            if self.rows:
                self._decode()
            elif not self._waiting and self._idle_work:
                self._recompute_answer(self._idle_work.pop())
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
        """Take every waiting request that fits, prefill them shortest first, then merge them
        into the batch at once.

        Which requests a round takes is FIFO (the first that does not fit ends the round, so
        nobody starves); only the order of their prefills changes. Each request's first token
        comes at the end of its own prefill, so when a burst arrives, prefilling the short
        prompts first gives most requests their first token sooner, and the last one no later
        (16 chat prompts of 36-226 tokens: the 8th first token after 482 prompt tokens of
        prefill instead of 660)."""
        taken: list[Request] = []
        with self._cond:
            while self._waiting:
                request = self._waiting[0]
                rows = [r for r in taken if not (r.score_from or r.cancelled)]
                if not (request.cancelled or request.score_from or self._fits(request, rows)):
                    break
                taken.append(self._waiting.popleft())
        # stable: FIFO among equals; a lone request skips the prefix-cache probe
        order = sorted(taken, key=self._uncached_tokens) if len(taken) > 1 else taken
        joined: list[tuple[Request, RowKV]] = []
        shared: dict[tuple[int, ...], tuple[np.ndarray, RowKV]] = {}  # this round's prefills
        done = 0
        try:
            for request in order:
                done += 1
                if request.cancelled:
                    self._finish(request, Step((), finish_reason="cancelled"))
                    continue
                if request.score_from:
                    self._score(request)
                    continue
                try:
                    row = self._prefill(request, shared)
                except Exception as exc:  # one bad request must not stop the others
                    self._finish(request, Step((), finish_reason="error", error=_describe(exc)))
                    continue
                if row is not None:
                    joined.append((request, row))
        finally:
            self.kv.add_rows([row for _, row in joined])
            self.rows.extend(request for request, _ in joined)
            with self._cond:  # anything not reached goes back to the front, in its order
                self._waiting.extendleft(reversed(order[done:]))

    def _uncached_tokens(self, request: Request) -> int:
        """The prompt tokens a request's prefill computes (what the prefix cache lacks)."""
        if request.cancelled:
            return 0
        tokens = request.prompt[: request.score_from] if request.score_from else request.prompt
        return len(request.prompt) - self.prefix_cache.lookup(tokens)[0]

    def _extend(
        self,
        tokens: tuple[int, ...],
        start: int,
        past: RowKV | None,
        chunk: int,
        abort: Callable[[], bool] | None = None,
    ) -> tuple[np.ndarray, RowKV] | None:
        """Compute the KV of ``tokens[start:]`` by prefill runs, given the KV of the first
        ``start`` tokens (``past``). Returns the last token's logits and the KV of all tokens,
        or None when ``abort()`` said so between runs."""
        start, past = even_start(tokens, start, past)
        count = len(tokens) - start
        padded = tokens + tokens[-1:] * (count % 2)  # the dummy: any valid id will do
        values: list[Any] = self.runner.layout.empty() if past is None else [a[None] for a in past]
        logits = None
        begin = start
        for length in prefill_runs(count, chunk):
            if abort is not None and abort():
                return None
            end = begin + length
            ids = np.asarray(padded[begin:end], np.int64)[None]
            mask = np.ones((1, end), np.int64)
            positions = np.arange(begin, end, dtype=np.int64)[None]
            # the last real token is the run's last, or its second-to-last before the dummy
            position = -1 - max(0, end - len(tokens))
            logits, values = self.runner.run(ids, mask, positions, values, position=position)
            begin = end
        assert logits is not None
        row = [_array(v)[0] for v in values]
        if row[0].shape[1] > len(tokens):  # the dummy's column
            row = [np.ascontiguousarray(a[:, : len(tokens)]) for a in row]
        return logits[0], row

    def _prefill(
        self,
        request: Request,
        shared: dict[tuple[int, ...], tuple[np.ndarray, RowKV]] | None = None,
    ) -> RowKV | None:
        """Run the prompt alone and send its first token. Returns its KV row, or None when the
        request already finished.

        ``shared`` holds the logits and KV of the prompts prefilled in this admission round: a
        request whose prompt is one of them (``n`` samples of one prompt) takes them as they
        are, its whole prompt reused. Exact: a prompt's prefill depends on the prompt alone, and
        the batch copies the row, so each request draws its own tokens from the same bits."""
        start = time.perf_counter()
        stats = request.stats
        stats.timings["queued_s"] = start - request.submitted_at
        prompt = request.prompt
        pending = self._masks.start([request])
        hit = shared.get(prompt) if shared is not None else None
        if hit is not None:
            logits, row = hit
            stats.prompt_tokens = stats.cached_tokens = len(prompt)
        else:
            cached, past = even_start(prompt, *self.prefix_cache.lookup(prompt))
            stats.prompt_tokens, stats.cached_tokens = len(prompt), cached
            self.prefix_cache.served(len(prompt), cached)
            computed = self._extend(prompt, cached, past, PREFILL_CHUNK)
            assert computed is not None
            logits, row = computed
            self.prefix_cache.store(prompt, row)
            if shared is not None:
                shared[prompt] = (logits, row)
        stats.timings["prefill_s"] = time.perf_counter() - start
        pending.wait()
        if self._emit(request, logits):
            return None
        return row

    def _score(self, request: Request) -> None:
        """A scoring job: prefill runs with the logits of every position, each run's tokens
        sent as one step. Runs of ``SCORE_CHUNK`` tokens, between which decoding rows wait
        (a long text delays them by one run at a time)."""
        tokens, start = request.prompt, request.score_from
        params = request.params
        request.stats.prompt_tokens = start
        try:
            cached, past = even_start(tokens, *self.prefix_cache.lookup(tokens[:start]))
            request.stats.cached_tokens = cached
            self.prefix_cache.served(len(tokens), cached)
            values: list[Any] = (
                self.runner.layout.empty() if past is None else [a[None] for a in past]
            )
            count = len(tokens) - cached
            padded = tokens + tokens[-1:] * (count % 2)  # even runs, as every prefill
            begin = cached
            for length in prefill_runs(count, SCORE_CHUNK):
                if request.cancelled:
                    self._finish(request, Step((), finish_reason="cancelled"))
                    return
                end = begin + length
                ids = np.asarray(padded[begin:end], np.int64)[None]
                logits, values = self.runner.run(
                    ids,
                    np.ones((1, end), np.int64),
                    np.arange(begin, end, dtype=np.int64)[None],
                    values,
                    position=None,
                )
                # positions [begin, end) predict tokens [begin + 1, end + 1)
                first = max(start, begin + 1)
                last = min(end + 1, len(tokens))
                scored = [
                    sampling.token_logprob(
                        logits[p - 1 - begin],
                        tokens[p],
                        params.top_logprobs,
                        details=True,
                        distribution=params.distribution,
                    )
                    for p in range(first, last)
                ]
                if scored:
                    done = last == len(tokens)
                    step = Step(
                        tuple(tokens[first:last]),
                        tuple(scored),
                        finish_reason="length" if done else None,
                    )
                    request.stats.output_tokens += len(scored)
                    (self._finish if done else self._send)(request, step)
                begin = end
            row = [_array(v)[0][:, : len(tokens)] for v in values]
            self.prefix_cache.store(tokens, [np.ascontiguousarray(a) for a in row])
        except Exception as exc:  # one bad job must not stop the others
            self._finish(request, Step((), finish_reason="error", error=_describe(exc)))

    def _recompute_answer(self, tokens: tuple[int, ...]) -> None:
        """Give the prefix cache a finished request's prompt + answer, computed by prefill as a
        later turn's cold prompt would be, so that turn reuses it exactly. Runs only while
        nothing waits; yields to any arrival between runs of ``IDLE_CHUNK`` tokens."""
        cached, past = self.prefix_cache.lookup(tokens, leave=0)
        if cached == len(tokens):
            return

        def arrived() -> bool:
            return bool(self._waiting or self._stopping)

        try:
            computed = self._extend(tokens, cached, past, IDLE_CHUNK, abort=arrived)
        except Exception:  # a cache warm-up only: nobody waits for it
            return
        if computed is not None:
            self.prefix_cache.store(tokens, computed[1])

    def _decode(self) -> None:
        try:
            drafts = self._drafts() if self.speculation else None
        except Exception:  # drafting only ever saves time: without it the step is plain
            drafts = None
        lengths = list(self.kv.lengths)
        pending = self._masks.start(self.rows)  # computed while the model runs
        try:
            if drafts is None:
                logits = self.kv.step(self.runner, [r.generated[-1] for r in self.rows])[:, None]
            else:
                assert isinstance(self.kv, EndPaddedKV)  # ``exact_steps`` graphs decode in place
                fed = [[r.generated[-1], *d] for r, d in zip(self.rows, drafts, strict=True)]
                logits = self.kv.step_tokens(self.runner, fed)
            pending.wait()
        except Exception as exc:  # the batch is lost; fail its rows, keep serving new ones
            pending.wait()
            for request in self.rows:
                self._finish(request, Step((), finish_reason="error", error=_describe(exc)))
            self._remove(list(range(len(self.rows))))
            return
        self.steps += 1
        finished = []
        for i, request in enumerate(self.rows):
            draft = [] if drafts is None else drafts[i]
            kept, done = self._accept(request, draft, logits[i])
            if draft:
                assert isinstance(self.kv, EndPaddedKV)
                self._record(request, len(draft), kept)
                # the last token and the kept drafts are in the cache; the rest are overwritten
                self.kv.truncate(i, lengths[i] + 1 + kept)
            if done:
                finished.append(i)
                self._cache_answer(request, i)
        self._remove(finished)

    def _drafts(self) -> list[list[int]] | None:
        """Each row's tokens to verify in this step, cut to the width that pays
        (``speculation.step_width``), or None for a plain one-token step.

        Exact: on these graphs a position's logits are the same bits in a multi-token step as
        in a one-token step, and a row's the same whatever its batch-mates feed, so every kept
        token and logprob is what plain decoding gives (tests/runtime/test_speculation.py)."""
        proposals = [self._propose(request) for request in self.rows]
        drafting = [
            (len(draft), request.drafter.acceptance)
            for request, draft in zip(self.rows, proposals, strict=True)
            if draft and request.drafter is not None
        ]
        if not drafting:
            return None
        # every row is fed ``width`` positions (short rows padded), all inside the context
        room = min(self.context_length - n for n in self.kv.lengths)
        width = min(step_width(drafting, len(self.rows)), room)
        if width <= 1:
            return None
        return [draft[: width - 1] for draft in proposals]

    def _propose(self, request: Request) -> list[int]:
        """The row's draft (``speculation.Drafter``): greedy rows without a grammar only,
        never past ``max_tokens`` or the context."""
        drafter = request.drafter
        if drafter is None:
            if not _greedy_and_free(request):
                return []
            drafter = request.drafter = Drafter(request.prompt)
        drafter.extend(request.generated)
        room = (
            min(
                request.params.max_tokens - len(request.generated),
                self.context_length - len(request.prompt) - len(request.generated),
            )
            - 1
        )
        return drafter.propose(limit=room)

    def _accept(self, request: Request, draft: list[int], logits: np.ndarray) -> tuple[int, bool]:
        """Emit the row's tokens from a step's logits: position 0 chooses the token after the
        last one; each later position counts only while the model chose the draft before it.
        Returns (drafted tokens kept, whether the request finished)."""
        kept = 0
        for position in range(len(draft) + 1):
            if request.cancelled:
                self._finish(request, Step((), finish_reason="cancelled"))
                return kept, True
            if self._emit(request, logits[position]):
                return kept, True
            if position == len(draft) or request.generated[-1] != draft[position]:
                break
            kept += 1
        return kept, False

    @staticmethod
    def _record(request: Request, drafted: int, kept: int) -> None:
        assert request.drafter is not None
        request.drafter.record(drafted, kept)
        stats = request.stats.timings
        stats["draft_tokens"] = stats.get("draft_tokens", 0) + drafted
        stats["accepted_draft_tokens"] = stats.get("accepted_draft_tokens", 0) + kept

    def _cache_answer(self, request: Request, index: int) -> None:
        """Give the prefix cache a finished row's KV (prompt and answer but its last token)
        as decoding computed it: on ``exact_steps`` graphs those are the bits a prefill of the
        same tokens computes, so a follow-up turn reuses them at once."""
        if not (self.runner.exact_steps and self.prefix_cache.budget_bytes > 0):
            return
        if request.cancelled or not request.generated:
            return
        tokens = request.prompt + tuple(request.generated[:-1])
        if self.kv.lengths[index] == len(tokens):
            self.prefix_cache.store(tokens, self.kv.row(index))

    def _remove(self, indices: list[int]) -> None:
        if indices:
            self.kv.remove(indices)
            drop = set(indices)
            self.rows = [r for i, r in enumerate(self.rows) if i not in drop]

    def _emit(self, request: Request, logits: np.ndarray) -> bool:
        """Choose a token, send its Step; True when the request is finished."""
        params = request.params
        forced = params.forced_tokens
        try:
            drawn_from = logits  # what the token is chosen from (a grammar masks it)
            if forced:
                token = forced[len(request.generated)]
            elif request.constraint is not None:
                drawn_from = request.constraint.masked(logits)
                token = sampling.choose(drawn_from, params, request.rng)
                token = request.constraint.admit(token)  # budget-aware closing may replace it
                request.constraint.accept(token)
            else:
                token = sampling.choose(logits, params, request.rng)
            logprob: tuple[TokenIdLogprob, ...] | None = None
            if params.logprobs or params.top_logprobs or params.details or params.distribution:
                lp = sampling.token_logprob(
                    logits,
                    token,
                    params.top_logprobs,
                    details=params.details,
                    distribution=params.distribution,
                )
                if params.processed_logprobs:
                    processed = lp.logprob
                    if sampling.processes(params, masked=drawn_from is not logits):
                        processed = sampling.processed_logprob(drawn_from, token, params)
                    lp = dataclasses.replace(lp, processed=processed)
                logprob = (lp,)
        except Exception as exc:
            self._finish(request, Step((), finish_reason="error", error=_describe(exc)))
            return True
        request.generated.append(token)
        stats = request.stats
        stats.output_tokens = len(request.generated)
        if stats.first_token_time is None:
            stats.first_token_time = time.perf_counter()
        reason: FinishReason | None = None
        eos = token in self.stop_ids and not params.ignore_eos
        if not forced and (eos or token in params.stop_token_ids):
            reason = "stop"
            closing = request.constraint.closing if request.constraint is not None else None
            if closing is not None and closing.closed_early:
                reason = "length"  # the budget ended the answer (it closed it in time)
                stats.timings["closing_tokens"] = closing.closed_tokens
        elif (
            len(request.generated) >= params.max_tokens
            or len(request.prompt) + len(request.generated) >= self.context_length
        ):
            reason = "length"
        closed = request.constraint is not None and request.constraint.closing.closed_early
        step = Step((token,), logprob, finish_reason=reason, closed=closed)
        if reason and request.constraint is not None:
            guarded = getattr(request.constraint.constraint, "guarded", 0)
            if guarded:  # tokens chosen while the repetition guard banned a continuation
                stats.timings["guarded_tokens"] = guarded
        if reason:
            # graphs whose decode steps compute other bits than prefill (GroupQueryAttention)
            # re-compute the answer by prefill when idle; others cache it as it is
            if self.prefix_cache.budget_bytes > 0 and not self.runner.exact_steps:
                self._idle_work.append(request.prompt + tuple(request.generated))
            self._finish(request, step)
        else:
            self._send(request, step)
        return reason is not None

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


def even_start(tokens: tuple[int, ...], start: int, past: RowKV | None) -> tuple[int, RowKV | None]:
    """Where to start prefilling so that an even number of tokens remains: one cached token
    earlier when the count is odd (its KV computes to the same bits), so a dummy token is only
    ever needed on a cold prompt, which leaves a column for it below the context length."""
    if (len(tokens) - start) % 2 and start > 0 and past is not None:
        start -= 1
        past = [a[:, :start] for a in past]
    return start, past


def prefill_runs(count: int, chunk: int = PREFILL_CHUNK) -> list[int]:
    """Lengths of the prefill runs that compute ``count`` tokens: even, at most ``chunk`` (even)
    tokens each; when ``count`` is odd the last run carries one dummy token more."""
    if chunk < 2 or chunk % 2:
        raise ValueError(f"the prefill chunk must be even and >= 2, got {chunk}")
    total = count + count % 2
    runs = [chunk] * (total // chunk)
    if total % chunk:
        runs.append(total % chunk)
    return runs


def _greedy_and_free(request: Request) -> bool:
    """Whether drafted tokens can be checked by comparison: greedy, no grammar, no forcing."""
    params = request.params
    return (
        params.temperature == 0
        and request.constraint is None
        and not params.forced_tokens
        and not request.score_from
    )


def _array(value: Any) -> np.ndarray:
    """A run's present KV as numpy (runners return OrtValues or, for in-place graphs, arrays)."""
    return value if isinstance(value, np.ndarray) else value.numpy()


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
