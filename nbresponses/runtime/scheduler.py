"""Continuous batching in one worker thread: admit, prefill, decode one step, emit, repeat.

Each iteration (1) drops cancelled rows, (2) admits waiting requests in FIFO order while the batch
size and KV budget allow, prefilling each one alone, shortest first (reusing cached prefix KV;
identical prompts admitted together are prefilled once), and merging them into the running
batch, and scores the round's scoring jobs (short ones as the rows of one run: ``together``),
then (3) runs one decode step for every row: one token each, or, when rows have drafts
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
logits, so a constrained row is as exact as a free one (``constraints.py``). A row's
``logit_bias`` is added to a copy of its own logits before the mask and the choice
(``sampling.biased``), so it changes no other row and no reported raw logprob.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nbresponses.runtime import sampling, together
from nbresponses.runtime.constraints import MaskWorker, RowConstraint
from nbresponses.runtime.kv import DecodingRows, EndPaddedKV, RowKV, SeparateKV
from nbresponses.runtime.prefix_cache import PrefixCache, common_length
from nbresponses.runtime.runner import OnnxRunner
from nbresponses.runtime.speculation import EVERY_COLUMN, OWN_COLUMNS, Drafter, step_width
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


@dataclass(eq=False, kw_only=True)
class Request:
    """What the worker keeps of any request. ``sink`` must be safe to call from the worker."""

    prompt: tuple[int, ...]
    sink: Callable[[Step], None]
    id: int = field(default_factory=lambda: next(_ids))
    cancelled: bool = False
    done: bool = False
    submitted_at: float = field(default_factory=time.perf_counter)
    # what the engine measured so far (the worker's alone): its final step carries it
    stats: GenerationStats = field(default_factory=GenerationStats)

    @property
    def reusable(self) -> tuple[int, ...]:
        """The tokens to look up in the prefix cache (which leaves their last one to compute)."""
        return self.prompt

    def measured(self) -> GenerationStats:
        """The stats to send with the final step."""
        return self.stats


@dataclass(eq=False, kw_only=True)
class GenerateRequest(Request):
    """A generation: prefilled, then a row of the decoding batch until it finishes."""

    params: SamplingParams
    budget_tokens: int  # prompt + the most tokens it may generate (KV reservation)
    rng: np.random.Generator = field(init=False)
    bias: sampling.Bias | None = field(init=False, default=None)  # its logit_bias as arrays
    constraint: RowConstraint | None = field(init=False, default=None)
    generated: list[int] = field(default_factory=list)
    drafter: Drafter | None = None  # speculation's n-gram index of prompt + generated

    def __post_init__(self) -> None:
        self.rng = sampling.make_rng(self.params)
        self.bias = sampling.bias_of(self.params)
        if self.params.constraint is not None and not self.params.forced_tokens:
            budget = self.budget_tokens - len(self.prompt)  # the most tokens it may generate
            self.constraint = RowConstraint(self.params.constraint(), budget)

    def measured(self) -> GenerationStats:
        return dataclasses.replace(self.stats, output_tokens=len(self.generated))


@dataclass(eq=False, kw_only=True)
class ScoreRequest(Request):
    """A scoring job: the logprobs of ``prompt[start:]``, computed by prefill runs, each given
    the tokens before it; it generates nothing and never joins the decoding batch."""

    start: int  # the first scored position (>= 1)
    top_logprobs: int = 0
    distribution: bool = False  # each entry also carries its whole log-softmax

    @property
    def reusable(self) -> tuple[int, ...]:
        return self.prompt[: self.start]  # the first scored token needs the logits before it


Queued = GenerateRequest | ScoreRequest  # what ``submit`` takes: a request of either kind


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
        sending: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext,
    ) -> None:
        """``sending()`` wraps a decode step's sends: the generator's hands them over to the
        consumers' loops together, when the step's rows are all done."""
        self.runner = runner
        self._sending = sending
        self.stop_ids = frozenset(int(t) for t in stop_ids)
        self.context_length = context_length
        self.max_batch_size = max_batch_size
        self.kv_budget_bytes = kv_budget_bytes
        self.prefix_cache = prefix_cache
        self.kv = self._empty_kv()
        self.speculation = runner.exact_steps  # verify drafted tokens in a step (below)
        # what a wider step costs (``speculation.StepCost``): a row's attention reads every
        # column of its buffers on standard-operator graphs, its own columns on ours
        self.step_cost = EVERY_COLUMN if runner.reads_every_column else OWN_COLUMNS
        self.scoring_together = runner.exact_steps  # short scoring jobs share runs (below)
        self.rows: list[GenerateRequest] = []
        self.steps = 0  # decode steps run (for tests and stats)
        self._waiting: deque[Queued] = deque()
        # finished requests' prompt + answer, to re-compute by prefill when idle (newest last)
        self._idle_work: deque[tuple[int, ...]] = deque(maxlen=IDLE_QUEUE)
        self._masks = MaskWorker()
        self._cond = threading.Condition()
        self._idle = threading.Event()  # set while the worker has nothing at all to do
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="nbresponses-engine", daemon=True)
        self._thread.start()

    # -- called from any thread ---------------------------------------------------------------

    def submit(self, request: Queued) -> None:
        self.submit_many([request])

    def submit_many(self, requests: Sequence[Queued]) -> None:
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
            try:
                self._drop_cancelled()
                self._admit()
                if self.rows:
                    self._decode()
                elif not self._waiting and self._idle_work:
                    self._recompute_answer(self._idle_work.pop())
            except Exception as exc:  # a fault of the engine's own: fail the rows, not hang them
                self._fail_rows(exc)
        for request in [*self.rows, *self._waiting]:
            self._finish(request, Step((), finish_reason="cancelled"))
        self.rows.clear()
        self._waiting.clear()

    def _empty_kv(self) -> DecodingRows:
        if self.runner.kv_in_place:
            return EndPaddedKV(
                self.runner.layout, reads_every_column=self.runner.reads_every_column
            )
        return SeparateKV(self.runner.layout)

    def _fail_rows(self, exc: Exception) -> None:
        """End every running request with the error and start over with an empty batch: the
        thread that decodes must outlive a bug (the requests waiting still run), else every
        request, running or to come, waits forever."""
        rows, self.rows = self.rows, []
        self.kv = self._empty_kv()
        for request in rows:
            with contextlib.suppress(Exception):
                self._finish(request, Step((), finish_reason="error", error=_describe(exc)))

    def _drop_cancelled(self) -> None:
        gone = [i for i, r in enumerate(self.rows) if r.cancelled]
        for i in gone:
            self._finish(self.rows[i], Step((), finish_reason="cancelled"))
        self._remove(gone)

    def _fits(self, request: GenerateRequest, pending: list[GenerateRequest]) -> bool:
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
        into the batch at once; the round's scoring jobs run after the prefills
        (``_score_all``: short ones as the rows of one run).

        Which requests a round takes is FIFO (the first that does not fit ends the round, so
        nobody starves); only the order of their prefills changes. Each request's first token
        comes at the end of its own prefill, so when a burst arrives, prefilling the short
        prompts first gives most requests their first token sooner, and the last one no later
        (16 chat prompts of 36-226 tokens: the 8th first token after 482 prompt tokens of
        prefill instead of 660)."""
        taken: list[Queued] = []
        rows: list[GenerateRequest] = []  # of those, the ones that will take a batch row
        with self._cond:
            while self._waiting:
                request = self._waiting[0]
                if isinstance(request, GenerateRequest) and not request.cancelled:
                    if not self._fits(request, rows):
                        break
                    rows.append(request)
                taken.append(self._waiting.popleft())
        # stable: FIFO among equals; a lone request skips the prefix-cache probe
        order = sorted(taken, key=self._uncached_tokens) if len(taken) > 1 else taken
        joined: list[tuple[GenerateRequest, RowKV]] = []
        shared: dict[tuple[int, ...], tuple[np.ndarray, RowKV]] = {}  # this round's prefills
        scoring: list[ScoreRequest] = []  # run after the prefills, short ones together
        done = 0
        try:
            for request in order:
                done += 1
                if request.cancelled:
                    self._finish(request, Step((), finish_reason="cancelled"))
                    continue
                if isinstance(request, ScoreRequest):
                    scoring.append(request)
                    continue
                try:
                    row = self._prefill(request, shared)
                except Exception as exc:  # one bad request must not stop the others
                    self._finish(request, Step((), finish_reason="error", error=_describe(exc)))
                    continue
                if row is not None:
                    joined.append((request, row))
            self._score_all(scoring)
        finally:
            with self._cond:  # anything not reached goes back to the front, in its order
                unscored = [r for r in scoring if not r.done]
                self._waiting.extendleft(reversed(unscored + order[done:]))
            # rows first: if the KV call raises, _fail_rows ends them rather than losing them
            self.rows.extend(request for request, _ in joined)
            self.kv.add_rows([row for _, row in joined])

    def _uncached_tokens(self, request: Queued) -> int:
        """The prompt tokens a request's prefill computes (what the prefix cache lacks)."""
        if request.cancelled:
            return 0
        return len(request.prompt) - self.prefix_cache.lookup(request.reusable)[0]

    def _extend(
        self,
        tokens: tuple[int, ...],
        start: int,
        past: RowKV | None,
        chunk: int,
        abort: Callable[[], bool] | None = None,
        each_run: Callable[[int, np.ndarray], None] | None = None,
        logits_from: int = 0,
    ) -> tuple[np.ndarray, RowKV] | None:
        """Compute the KV of ``tokens[start:]`` by prefill runs, given the KV of the first
        ``start`` tokens (``past``). Returns the last token's logits and the KV of all tokens,
        or None when ``abort()`` said so between runs. ``each_run(begin, logits)`` gets the
        logits of each run's positions from ``logits_from`` on (at least its last two: the
        LM head skips the others), ``begin`` the first of them (a scoring job's)."""
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
            last = -1 - max(0, end - len(tokens))
            position = None if each_run is not None else last
            first = max(begin, min(logits_from, end - 2))
            logits, values = self.runner.run(
                ids, mask, positions, values, position=position, keep=end - first
            )
            if each_run is not None:  # the last positions (all where a graph keeps all)
                each_run(end - len(logits), logits)
                logits = logits[[last]]  # the last real token's, as a run without the hook
            begin = end
        assert logits is not None
        row = [_array(v)[0] for v in values]
        if row[0].shape[1] > len(tokens):  # the dummy's column
            row = [np.ascontiguousarray(a[:, : len(tokens)]) for a in row]
        return logits[0], row

    def _prefill(
        self,
        request: GenerateRequest,
        shared: dict[tuple[int, ...], tuple[np.ndarray, RowKV]] | None = None,
    ) -> RowKV | None:
        """Run the prompt alone and send its first token. Returns its KV row, or None when the
        request already finished.

        ``shared`` holds the logits and KV of the prompts prefilled in this admission round: a
        request whose prompt is one of them (``n`` samples of one prompt) takes them as they
        are, its whole prompt reused. Exact: a prompt's prefill depends on the prompt alone, and
        the batch copies the row, so each request draws its own tokens from the same bits."""
        start = time.perf_counter()
        prompt = request.prompt
        pending = self._masks.start([request])
        hit = shared.get(prompt) if shared is not None else None
        if hit is not None:
            cached, past = len(prompt), None
        else:
            cached, past = even_start(prompt, *self.prefix_cache.lookup(prompt))
        request.stats = dataclasses.replace(
            request.stats,
            prompt_tokens=len(prompt),
            cached_tokens=cached,
            queued_s=start - request.submitted_at,
        )
        if hit is not None:
            logits, row = hit
        else:
            self.prefix_cache.served(len(prompt), cached)
            computed = self._extend(prompt, cached, past, PREFILL_CHUNK)
            assert computed is not None
            logits, row = computed
            self.prefix_cache.store(prompt, row)
            if shared is not None:
                shared[prompt] = (logits, row)
        request.stats = dataclasses.replace(request.stats, prefill_s=time.perf_counter() - start)
        pending.wait()
        if self._emit(request, logits):
            return None
        return row

    def _score_all(self, requests: list[ScoreRequest]) -> None:
        """An admission round's scoring jobs, in their order: short ones as the rows of one
        run (``together.next_group``), the others alone (``_score``). A job is looked up in the
        prefix cache once (a lookup scans every entry), and again only when a run has just
        computed a beginning it shares: what it waited for."""
        pending = list(requests)
        looked: dict[ScoreRequest, tuple[int, RowKV | None]] = {}
        while pending:
            for request in [r for r in pending if r.cancelled]:
                self._finish(request, Step((), finish_reason="cancelled"))
            pending = [r for r in pending if not r.cancelled]
            if not pending:
                return
            if not self.scoring_together:  # rows of one run need equal bits at every shape
                self._score(pending.pop(0))
                continue
            for r in pending:
                if r not in looked:
                    looked[r] = self.prefix_cache.lookup(r.reusable)
            group = together.next_group(
                [(r.prompt, looked[r][0], len(r.reusable) - 1) for r in pending],
                max_tokens=SCORE_CHUNK,
                reuse=self.prefix_cache.budget_bytes > 0,
            )
            chosen = [pending[i] for i in group]
            pending = [r for i, r in enumerate(pending) if i not in group]
            if len(chosen) == 1:
                self._score(chosen[0])
            else:
                self._score_rows([(r, *looked[r]) for r in chosen])
            for r in pending:
                shared = max(common_length(r.reusable, c.prompt) for c in chosen)
                if shared > looked[r][0] + together.MIN_SHARED:
                    del looked[r]

    def _score_rows(self, jobs: list[tuple[ScoreRequest, int, RowKV | None]]) -> None:
        """Scoring jobs (each with its cached tokens and their KV) as the rows of one run, on
        buffers of their own: the decoding batch's rows are not in it."""
        kv = EndPaddedKV(self.runner.layout, reads_every_column=self.runner.reads_every_column)
        empty = [a[0] for a in self.runner.layout.empty()]
        fed = [list(request.prompt[cached:]) for request, cached, _ in jobs]
        # logits from each row's first scored token's predecessor on: the run keeps the
        # positions from the earliest of those (the LM head skips the ones before)
        skipped = min(max(0, request.start - 1 - cached) for request, cached, _ in jobs)
        width = max(len(f) for f in fed)
        try:
            kv.add_rows([empty if past is None else past for _, _, past in jobs])
            logits = kv.step_tokens(self.runner, fed, keep=width - skipped)
            skipped = width - logits.shape[1]
        except Exception:  # one bad job must fail alone: each runs by itself
            for request, _, _ in jobs:
                self._score(request)
            return
        for i, (request, cached, _) in enumerate(jobs):
            try:
                request.stats = dataclasses.replace(
                    request.stats, prompt_tokens=request.start, cached_tokens=cached
                )
                self.prefix_cache.served(len(request.prompt), cached)
                self._deliver(request, cached + skipped, logits[i, : len(fed[i]) - skipped])
                if self.prefix_cache.budget_bytes > 0:  # (a row's KV is a copy)
                    self.prefix_cache.store(request.prompt, kv.row(i))
            except Exception as exc:
                self._finish(request, Step((), finish_reason="error", error=_describe(exc)))

    def _score(self, request: ScoreRequest) -> None:
        """A scoring job alone: prefill runs with the logits of every position, each run's
        scored tokens sent as one step. Runs of ``SCORE_CHUNK`` tokens, between which decoding
        rows wait (a long text delays them by one run at a time)."""
        tokens = request.prompt
        try:
            cached, past = even_start(tokens, *self.prefix_cache.lookup(request.reusable))
            request.stats = dataclasses.replace(
                request.stats, prompt_tokens=request.start, cached_tokens=cached
            )
            self.prefix_cache.served(len(tokens), cached)
            computed = self._extend(
                tokens,
                cached,
                past,
                SCORE_CHUNK,
                lambda: request.cancelled,
                each_run=lambda begin, logits: self._deliver(request, begin, logits),
                logits_from=request.start - 1,
            )
            if computed is None:
                self._finish(request, Step((), finish_reason="cancelled"))
                return
            self.prefix_cache.store(tokens, computed[1])
        except Exception as exc:  # one bad job must not stop the others
            self._finish(request, Step((), finish_reason="error", error=_describe(exc)))

    def _deliver(self, request: ScoreRequest, begin: int, logits: np.ndarray) -> None:
        """Send the scored tokens of a run: its positions [begin, begin + len(logits))
        predict tokens [begin + 1, ...); the job ends with its last token."""
        tokens = request.prompt
        first, last = max(request.start, begin + 1), min(begin + len(logits) + 1, len(tokens))
        scored = sampling.token_logprobs(
            logits[first - 1 - begin : last - 1 - begin],
            tokens[first:last],
            request.top_logprobs,
            details=True,
            distribution=request.distribution,
            native=self.runner.token_stats,
            threads=self.runner.threads,
        )
        if scored:
            request.stats = dataclasses.replace(
                request.stats, output_tokens=request.stats.output_tokens + len(scored)
            )
            if last == len(tokens):
                self._finish(request, Step(tokens[first:last], scored, finish_reason="length"))
            else:
                self._send(request, Step(tokens[first:last], scored))

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
        with self._sending():
            firsts = self._choose_firsts(logits[:, 0])
            for i, request in enumerate(self.rows):
                draft = [] if drafts is None else drafts[i]
                kept, done = self._accept(request, draft, logits[i], firsts[i])
                if draft:
                    assert isinstance(self.kv, EndPaddedKV)
                    self._count_drafts(request, len(draft), kept)
                    # the last token and the kept drafts are in the cache; the rest are
                    # overwritten
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
        width = min(step_width(drafting, len(self.rows), cost=self.step_cost), room)
        if width <= 1:
            return None
        return [draft[: width - 1] for draft in proposals]

    def _propose(self, request: GenerateRequest) -> list[int]:
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

    def _accept(
        self,
        request: GenerateRequest,
        draft: list[int],
        logits: np.ndarray,
        first: _Chosen | None = None,
    ) -> tuple[int, bool]:
        """Emit the row's tokens from a step's logits: position 0 chooses the token after the
        last one (``first``: chosen already, ``_choose_firsts``); each later position counts
        only while the model chose the draft before it. Returns (drafted tokens kept, whether
        the request finished)."""
        kept = 0
        for position in range(len(draft) + 1):
            if request.cancelled:
                self._finish(request, Step((), finish_reason="cancelled"))
                return kept, True
            if request.done:  # finished as its first token was chosen (an error, no room)
                return kept, True
            if self._emit(request, logits[position], first if position == 0 else None):
                return kept, True
            if position == len(draft) or request.generated[-1] != draft[position]:
                break
            kept += 1
        return kept, False

    @staticmethod
    def _count_drafts(request: GenerateRequest, drafted: int, kept: int) -> None:
        assert request.drafter is not None
        request.drafter.record(drafted, kept)
        stats = request.stats
        request.stats = dataclasses.replace(
            stats,
            draft_tokens=stats.draft_tokens + drafted,
            accepted_draft_tokens=stats.accepted_draft_tokens + kept,
        )

    def _cache_answer(self, request: GenerateRequest, index: int) -> None:
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
            order = self.kv.remove(indices)
            self.rows = [self.rows[i] for i in order]

    def _choose_firsts(self, logits: np.ndarray) -> list[_Chosen | None]:
        """Every row's token at a step's first position ([rows, vocab]), then the logprobs of
        those that report them in one call (``sampling.token_logprobs``: the graph's threads,
        idle until the next run, share the rows; each row's numbers are its own alone). None
        for a row cancelled or finished here (an error is that row's alone)."""
        chosen: list[_Chosen | None] = []
        for request, row in zip(self.rows, logits, strict=True):
            found = None
            if not request.cancelled:
                try:
                    found = self._choose(request, row)
                except Exception as exc:
                    self._finish(request, Step((), finish_reason="error", error=_describe(exc)))
            chosen.append(found)
        wanting = [
            (i, c) for i, c in enumerate(chosen) if c is not None and _reports(self.rows[i].params)
        ]
        if not wanting:
            return chosen
        computed: tuple[TokenIdLogprob, ...] | None = None
        if len(wanting) > 1:  # a row alone makes its own call (the quicker: ~50 against ~60 us)
            params = [self.rows[i].params for i, _ in wanting]
            rows = logits if len(wanting) == len(chosen) else logits[[i for i, _ in wanting]]
            try:
                computed = sampling.token_logprobs(
                    rows,
                    [c.token for _, c in wanting],
                    [p.top_logprobs for p in params],
                    details=[p.details for p in params],
                    distribution=[p.distribution for p in params],
                    native=self.runner.token_stats,
                    threads=self.runner.threads,
                )
            except Exception:  # each row then computes its own: one bad row fails alone
                computed = None
        for n, (i, found) in enumerate(wanting):
            request = self.rows[i]
            try:
                given = computed[n] if computed is not None else None
                found.logprob = self._logprob(request, logits[i], found, given)
            except Exception as exc:
                self._finish(request, Step((), finish_reason="error", error=_describe(exc)))
                chosen[i] = None
        return chosen

    def _choose(self, request: GenerateRequest, logits: np.ndarray) -> _Chosen | None:
        """The row's next token, and what it was drawn from; None when the request finished
        instead (a grammar's budget left no output that fits)."""
        params = request.params
        forced = params.forced_tokens
        drawn_from = logits  # what the token is chosen from (biased, a grammar masks it)
        if request.bias is not None:
            drawn_from = sampling.biased(logits, request.bias)
        if forced:
            token = forced[len(request.generated)]
        elif request.constraint is not None:
            drawn_from = request.constraint.masked(drawn_from)
            if request.constraint.closing.hopeless:  # not even the shortest output fits
                self._finish(request, Step((), finish_reason="length", closed=True))
                return None
            token = sampling.choose(drawn_from, params, request.rng)
            token = request.constraint.admit(token)  # budget-aware closing may replace it
            request.constraint.accept(token)
        else:
            token = sampling.choose(drawn_from, params, request.rng)
        return _Chosen(token, drawn_from, masked=drawn_from is not logits)

    def _logprob(
        self,
        request: GenerateRequest,
        logits: np.ndarray,
        chosen: _Chosen,
        computed: TokenIdLogprob | None = None,
    ) -> tuple[TokenIdLogprob, ...] | None:
        """The chosen token's logprob as the request asked for it (``computed``: its numbers
        found already, with the others of a step), or None when it asked for none."""
        params = request.params
        if not _reports(params):
            return None
        lp = computed
        if lp is None:
            lp = sampling.token_logprob(
                logits,
                chosen.token,
                params.top_logprobs,
                details=params.details,
                distribution=params.distribution,
                native=self.runner.token_stats,
            )
        if params.processed_logprobs:
            processed = lp.logprob
            if sampling.processes(params, masked=chosen.masked):
                processed = sampling.processed_logprob(chosen.drawn_from, chosen.token, params)
            lp = dataclasses.replace(lp, processed=processed)
        return (lp,)

    def _emit(
        self, request: GenerateRequest, logits: np.ndarray, chosen: _Chosen | None = None
    ) -> bool:
        """Choose a token (or take the one ``chosen`` already, with its logprob), send its
        Step; True when the request is finished."""
        params = request.params
        forced = params.forced_tokens
        if chosen is None:
            try:
                chosen = self._choose(request, logits)
                if chosen is None:
                    return True
                chosen.logprob = self._logprob(request, logits, chosen)
            except Exception as exc:
                self._finish(request, Step((), finish_reason="error", error=_describe(exc)))
                return True
        token, logprob = chosen.token, chosen.logprob
        request.generated.append(token)
        if request.stats.first_token_time is None:
            request.stats = dataclasses.replace(request.stats, first_token_time=time.perf_counter())
        reason: FinishReason | None = None
        eos = token in self.stop_ids and not params.ignore_eos
        if not forced and (eos or token in params.stop_token_ids):
            reason = "stop"
            closing = request.constraint.closing if request.constraint is not None else None
            if closing is not None and closing.closed_early:
                reason = "length"  # the budget ended the answer (it closed it in time)
                request.stats = dataclasses.replace(
                    request.stats, closing_tokens=closing.closed_tokens
                )
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
                request.stats = dataclasses.replace(request.stats, guarded_tokens=guarded)
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
        """Send a request's final step, with its stats."""
        if not request.done:
            request.done = True
            total = time.perf_counter() - request.submitted_at
            stats = dataclasses.replace(request.measured(), total_s=total)
            self._send(request, dataclasses.replace(step, stats=stats))

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


@dataclass(slots=True)
class _Chosen:
    """A row's chosen token, what it was drawn from, and its logprob once computed."""

    token: int
    drawn_from: np.ndarray
    masked: bool  # drawn from other logits than the model's (a bias, a grammar)
    logprob: tuple[TokenIdLogprob, ...] | None = None


def _reports(params: SamplingParams) -> bool:
    """Whether a request reports its tokens' logprobs (in any form)."""
    return bool(params.logprobs or params.top_logprobs or params.details or params.distribution)


def _greedy_and_free(request: GenerateRequest) -> bool:
    """Whether drafted tokens can be checked by comparison: greedy, no grammar, no forcing."""
    params = request.params
    return params.temperature == 0 and request.constraint is None and not params.forced_tokens


def _array(value: Any) -> np.ndarray:
    """A run's present KV as numpy (runners return OrtValues or, for in-place graphs, arrays)."""
    return value if isinstance(value, np.ndarray) else value.numpy()


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
