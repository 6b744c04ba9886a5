"""The token generator: an ONNX Runtime causal LM behind the ``TokenSource`` contract.

``await TokenGenerator.load()`` prepares (or finds cached) and loads a model; ``generate()``
returns an async stream of ``Step``s for one request. Requests run concurrently in one
continuously batched decode loop on a worker thread (see ``scheduler.py``); consumers only ever
await.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from nbresponses.models.cpu import physical_cores
from nbresponses.models.prepared import PreparedModel
from nbresponses.runtime import sampling
from nbresponses.runtime.prefix_cache import PrefixCache
from nbresponses.runtime.runner import OnnxRunner
from nbresponses.runtime.scheduler import GenerateRequest, Request, Scheduler, ScoreRequest
from nbresponses.tokens.contract import SamplingParams, Step, Tokenizer

DEFAULT_KV_BUDGET = 4 << 30  # bytes of running-batch KV (left padding included)
DEFAULT_PREFIX_CACHE = 512 << 20  # bytes of finished requests' KV kept for reuse


class _Held(threading.local):
    """The mailboxes a thread's held posts went to (None: posts wake their loop at once)."""

    def __init__(self) -> None:
        self.boxes: list[_Mailbox] | None = None


_held = _Held()


@contextlib.contextmanager
def held_posts() -> Iterator[None]:
    """Posts made inside wake each consumer loop once, at the end: a decode step's rows are
    handed over together, after the step, so the loop's work (one drain, every consumer) runs
    while the next step computes (ONNX Runtime releases the GIL) instead of taking the GIL
    from the worker between two rows of this one."""
    if _held.boxes is not None:  # nested: the outer one wakes
        yield
        return
    _held.boxes = []
    try:
        yield
    finally:
        boxes, _held.boxes = _held.boxes, None
        for box in boxes:
            box.wake()


class _Mailbox:
    """Hands steps from the worker thread to one event loop, one wake-up per batch of steps.

    ``call_soon_threadsafe`` per step wakes the loop (a syscall and a loop iteration) once per
    row per decode step; at 16 rows that is 16 wake-ups competing with ONNX Runtime for two
    cores. Steps posted while a drain is pending ride along with it, and posts inside
    ``held_posts`` (a decode step) wake the loop once, when it ends.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)  # weak: the engine keys its mailboxes by loop, weakly
        self._lock = threading.Lock()
        self._items: deque[tuple[asyncio.Queue[Step], Step]] = deque()
        self._scheduled = False  # a drain is pending on the loop
        self._waking = False  # listed in a thread's held posts

    def post(self, queue: asyncio.Queue[Step], step: Step) -> None:
        """Raises RuntimeError when the loop is closed (the scheduler then cancels the row)."""
        loop = self._loop()
        if loop is None or loop.is_closed():
            raise RuntimeError("the consumer's event loop is closed")
        with self._lock:
            self._items.append((queue, step))
            if self._scheduled:
                return
            held = _held.boxes
            if held is not None:
                if not self._waking:
                    self._waking = True
                    held.append(self)
                return
            self._scheduled = True
        self._schedule(loop)

    def wake(self) -> None:
        """Schedule a drain of what held posts left (the end of ``held_posts``)."""
        with self._lock:
            self._waking = False
            if self._scheduled or not self._items:
                return
            self._scheduled = True
        loop = self._loop()
        if loop is None or loop.is_closed():
            return  # nobody will read them; the rows' next post cancels them
        with contextlib.suppress(RuntimeError):  # closed meanwhile: as above
            self._schedule(loop)

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            loop.call_soon_threadsafe(self._drain)
        except RuntimeError:
            with self._lock:
                self._scheduled = False
            raise

    def _drain(self) -> None:
        with self._lock:
            items, self._items = self._items, deque()
            self._scheduled = False
        for queue, step in items:
            queue.put_nowait(step)


class GenerationStream:
    """One request's steps, as an async iterator (a ``TokenStream``). Cancelling its consumer
    frees the batch row.

    ``cancel()`` (or ``generator.cancel(stream)``) ends it with a final
    ``finish_reason="cancelled"`` step; the final step carries the request's stats;
    ``request_id`` identifies it in logs.
    """

    def __init__(self, scheduler: Scheduler, request: Request, queue: asyncio.Queue[Step]) -> None:
        self._scheduler = scheduler
        self._request = request
        self._queue = queue
        self._finished = False

    @property
    def request_id(self) -> int:
        return self._request.id

    def __aiter__(self) -> GenerationStream:
        return self

    async def __anext__(self) -> Step:
        if self._finished:
            raise StopAsyncIteration
        try:
            step = await self._queue.get()
        except asyncio.CancelledError:
            self.cancel()
            raise
        if step.finish_reason is not None:
            self._finished = True
        return step

    def cancel(self) -> None:
        if not self._request.done:
            self._scheduler.cancel(self._request)

    async def aclose(self) -> None:
        """Stop early (what ``async with contextlib.aclosing(stream)`` calls)."""
        if not self._finished:
            self._finished = True
            self.cancel()

    def __del__(self) -> None:  # dropped unfinished (a ``break`` in ``async for``): free the row
        request = getattr(self, "_request", None)
        if request is not None and not request.done:
            request.cancelled = True


class AdmissionGate:
    """Holds the next ``count`` requests and queues them at once (``TokenGenerator.together``):
    they reach one admission round, where identical prompts share one prefill."""

    def __init__(self, generator: TokenGenerator, count: int) -> None:
        self._generator = generator
        self.remaining = count
        self.held: list[GenerateRequest] = []
        self.released = False

    def take(self, request: GenerateRequest | None) -> None:
        """Count one ``generate`` call: its request, or None when it raised before queueing."""
        if request is not None:
            self.held.append(request)
        self.remaining -= 1
        if self.remaining <= 0:
            self.release()

    def release(self) -> None:
        """Queue what is held (also when fewer than ``count`` came: an error, a cancellation)."""
        if self.released:
            return
        self.released = True
        if self._generator._gate is self:
            self._generator._gate = None
        held, self.held = self.held, []
        if held:
            self._generator._scheduler.submit_many(held)

    def __enter__(self) -> AdmissionGate:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class TokenGenerator:
    """Continuous-batching ONNX Runtime engine; implements ``TokenSource``."""

    def __init__(
        self,
        prepared: PreparedModel,
        *,
        max_batch_size: int = 16,
        kv_budget_bytes: int = DEFAULT_KV_BUDGET,
        prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE,
        threads: int | None = None,
        tokenizer: Tokenizer | None = None,
    ) -> None:
        """Load a prepared model synchronously (seconds); in a kernel use ``await load()``."""
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        self.prepared = prepared
        self.tokenizer = tokenizer if tokenizer is not None else prepared.load_tokenizer()
        self.runner = OnnxRunner(prepared.onnx_path, threads=exact_threads(prepared, threads))
        self._context_length = min(
            prepared.context_length, self.runner.max_positions or prepared.context_length
        )
        self._eos = _eos_ids(self.tokenizer, prepared)
        # Exactness first: a graph whose numbers depend on the rest of a run gets no reuse.
        self.prefix_cache = PrefixCache(prefix_cache_bytes if prepared.prefix_reuse else 0)
        self._mailboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Mailbox] = (
            weakref.WeakKeyDictionary()
        )
        self._scheduler = Scheduler(
            self.runner,
            stop_ids=self._eos,
            context_length=self._context_length,
            max_batch_size=max_batch_size,
            kv_budget_bytes=kv_budget_bytes,
            prefix_cache=self.prefix_cache,
            sending=held_posts,
        )
        self._closed = False
        self._gate: AdmissionGate | None = None

    @classmethod
    async def load(
        cls,
        model: str | os.PathLike[str] | None = None,
        quantization: str | None = None,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        progress: bool = True,
        **options: Any,
    ) -> TokenGenerator:
        """Prepare (first time: export, quantize, evaluate; then cached) and load a model."""
        from nbresponses.models.prepare import prepare_model

        prepared = await asyncio.to_thread(
            prepare_model, model, quantization, cache_dir=cache_dir, progress=progress
        )
        return await asyncio.to_thread(cls, prepared, **options)

    # -- TokenSource ----------------------------------------------------------------------------

    @property
    def eos_token_ids(self) -> Sequence[int]:
        return self._eos

    @property
    def context_length(self) -> int:
        return self._context_length

    def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> GenerationStream:
        """Queue a request now and return its stream. Must be called with a running event loop.

        Raises ValueError before admission for an empty or too long prompt, token ids outside
        the vocabulary or invalid sampling settings. The stop token (eos or one of
        ``stop_token_ids``) is included in the final step, with ``finish_reason="stop"``.
        """
        try:
            prompt = self._check_request(prompt_ids, params)
        except Exception:
            if self._gate is not None:
                self._gate.take(None)
            raise
        queue, sink = self._channel()
        request = GenerateRequest(
            prompt=prompt,
            params=params,
            sink=sink,
            budget_tokens=min(len(prompt) + params.max_tokens, self._context_length),
        )
        if self._gate is not None:
            self._gate.take(request)
        else:
            self._scheduler.submit(request)
        return GenerationStream(self._scheduler, request, queue)

    def together(self, count: int) -> AdmissionGate:
        """Hold the next ``count`` ``generate`` calls and queue their requests at once, when
        the last one comes or the gate is released (``with generator.together(n): ...``), so they
        are admitted in one round (as many as the batch takes) and identical prompts among them
        are prefilled once: ``n`` samples of one prompt share its KV. Call it from the event
        loop that makes the requests."""
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        if self._gate is not None:
            self._gate.release()
        self._gate = AdmissionGate(self, count)
        return self._gate

    def _check_request(self, prompt_ids: Sequence[int], params: SamplingParams) -> tuple[int, ...]:
        if self._closed:
            raise RuntimeError("the engine is closed")
        sampling.validate(params)
        prompt = tuple(int(t) for t in prompt_ids)
        if not prompt:
            raise ValueError("the prompt is empty")
        if len(prompt) >= self._context_length:
            raise ValueError(
                f"the prompt has {len(prompt)} tokens; the model's context length is "
                f"{self._context_length}, leaving no room for an answer"
            )
        self._check_ids(prompt + params.forced_tokens)
        if params.logit_bias:
            self._check_ids(tuple(params.logit_bias), what="logit_bias token ids")
        if len(prompt) + len(params.forced_tokens) > self._context_length:
            raise ValueError(
                f"the prompt and the forced tokens ({len(prompt) + len(params.forced_tokens)}) "
                f"are longer than the model's context ({self._context_length})"
            )
        return prompt

    def score(
        self,
        token_ids: Sequence[int],
        *,
        start: int = 1,
        top_logprobs: int = 0,
        distribution: bool = False,
    ) -> GenerationStream:
        """The logprob of every token from ``start`` on, given those before it, computed in
        prefill runs (fast: many tokens per run). Steps carry the scored tokens, each with its
        logprob, rank, entropy and ``top_logprobs`` alternatives (and with ``distribution``
        its whole log-softmax); the last ends "length".

        A prefill computes a position with another summation order than a decode step does
        (docs/concepts/determinism.md): to reproduce the logprobs of a generation bit for bit,
        force its tokens with ``generate`` (``SamplingParams.forced_tokens``) instead.
        """
        if self._closed:
            raise RuntimeError("the engine is closed")
        tokens = tuple(int(t) for t in token_ids)
        if not 1 <= start < len(tokens):
            raise ValueError(f"start must be in [1, {len(tokens)}): got {start}")
        if len(tokens) > self._context_length:
            raise ValueError(
                f"{len(tokens)} tokens are more than the model's context ({self._context_length}):"
                " score them in windows"
            )
        self._check_ids(tokens)
        sampling.validate(SamplingParams(top_logprobs=top_logprobs))  # a generation's bounds
        queue, sink = self._channel()
        request = ScoreRequest(
            prompt=tokens,
            sink=sink,
            start=start,
            top_logprobs=top_logprobs,
            distribution=distribution,
        )
        self._scheduler.submit(request)
        return GenerationStream(self._scheduler, request, queue)

    def _check_ids(self, ids: Sequence[int], what: str = "token ids") -> None:
        vocab = self.runner.vocab_size
        if ids and (min(ids) < 0 or max(ids) >= vocab):
            raise ValueError(
                f"{what} must be in the vocabulary [0, {vocab}); got {min(ids)}..{max(ids)}"
            )

    def _channel(self) -> tuple[asyncio.Queue[Step], Callable[[Step], None]]:
        """A queue on the running loop, and the worker's sink into it (through the loop's
        mailbox)."""
        loop = asyncio.get_running_loop()
        mailbox = self._mailboxes.get(loop)
        if mailbox is None:
            mailbox = self._mailboxes[loop] = _Mailbox(loop)
        queue: asyncio.Queue[Step] = asyncio.Queue()

        def sink(step: Step) -> None:
            mailbox.post(queue, step)

        return queue, sink

    # -- control ------------------------------------------------------------------------------

    def cancel(self, stream: GenerationStream) -> None:
        """Stop a request; its stream ends with a ``cancelled`` step within one decode step."""
        stream.cancel()

    @property
    def running(self) -> int:
        """Requests decoding now."""
        return len(self._scheduler.rows)

    @property
    def waiting(self) -> int:
        """Requests queued for admission."""
        return self._scheduler.waiting

    @property
    def decode_steps(self) -> int:
        return self._scheduler.steps

    @property
    def speculation(self) -> bool:
        """Whether decode steps verify drafted tokens (``runtime/speculation.py``): on by default
        for graphs with exact multi-token steps, unavailable on others. Drafts change the
        speed only, never a token or a logprob, so off is for comparing speeds (and tests)."""
        return self._scheduler.speculation

    @speculation.setter
    def speculation(self, on: bool) -> None:
        if on and not self.runner.exact_steps:
            raise ValueError(f"{self.prepared.recipe!r} graphs have no exact multi-token steps")
        self._scheduler.speculation = on

    @property
    def scoring_together(self) -> bool:
        """Whether short scoring jobs queued together run as the rows of one graph run
        (``runtime/together.py``): on by default for graphs with exact multi-token steps,
        unavailable on others. It changes the speed only, never a logprob, so off is for
        comparing speeds (and tests)."""
        return self._scheduler.scoring_together

    @scoring_together.setter
    def scoring_together(self, on: bool) -> None:
        if on and not self.runner.exact_steps:
            raise ValueError(f"{self.prepared.recipe!r} graphs have no exact multi-token steps")
        self._scheduler.scoring_together = on

    def stats(self) -> dict[str, Any]:
        """Load and memory now: rows, the decoding KV and the prefix cache (``TokenSource``).

        Read from another thread than the decode loop's: each figure is current, together they
        may be one step apart."""
        return {
            "running": self.running,
            "waiting": self.waiting,
            "decode_steps": self.decode_steps,
            "kv_bytes": self._scheduler.kv.nbytes,
            "kv_budget_bytes": self._scheduler.kv_budget_bytes,
            "prefix_cache": self.prefix_cache.stats().as_dict(),
        }

    async def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no request runs or waits and the prefix cache holds every finished
        answer (re-computed while idle, so a follow-up turn reuses it). False on timeout."""
        return await asyncio.to_thread(self._scheduler.wait_idle, timeout)

    async def aclose(self) -> None:
        """Stop the worker; unfinished requests end with ``cancelled``."""
        if not self._closed:
            self._closed = True
            if self._gate is not None:  # held requests end cancelled, as queued ones do
                self._gate.release()
            await asyncio.to_thread(self._scheduler.close)

    close = aclose

    def close_sync(self) -> None:
        if not self._closed:
            self._closed = True
            if self._gate is not None:
                self._gate.release()
            self._scheduler.close()

    async def __aenter__(self) -> TokenGenerator:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def exact_threads(prepared: PreparedModel, threads: int | None) -> int:
    """The intra-op threads to run with: at most the model's attention heads.

    With more threads than batch rows x heads, ONNX Runtime's attention splits a long row's keys
    across threads for a one-token step ("flash decoding"), which sums in another order: a row
    alone would get other numbers than the same row in a batch (docs/concepts/determinism.md).
    """
    wanted = threads or physical_cores()
    heads = int(prepared.config.get("num_attention_heads") or 0)
    if heads and wanted > heads:
        if threads:
            warnings.warn(
                f"threads={threads} capped at the model's {heads} attention heads: more would "
                "make a request's logprobs depend on its batch-mates",
                stacklevel=3,
            )
        return heads
    return wanted


def _eos_ids(tokenizer: Tokenizer, prepared: PreparedModel) -> tuple[int, ...]:
    """The tokenizer's eos (repaired at prepare time) plus generation_config's, if consistent."""
    ids: list[int] = []
    eos_id = getattr(tokenizer, "eos_token_id", None)
    if eos_id is not None:
        ids.append(int(eos_id))
    path = prepared.path / "generation_config.json"
    if path.is_file():
        import json

        eos = json.loads(path.read_text()).get("eos_token_id")
        for token in eos if isinstance(eos, list) else [eos] if eos is not None else []:
            if int(token) not in ids and int(token) != getattr(tokenizer, "bos_token_id", None):
                ids.append(int(token))
    return tuple(ids)
