"""The engine's contract: what a request asks for and what it gets back, token by token.

These types are the only thing the families and the service know about the engine, so a
scripted token source (tests) and the real ONNX Runtime engine are interchangeable.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

FinishReason = Literal["stop", "length", "cancelled", "error"]


@runtime_checkable
class TokenConstraint(Protocol):
    """Which tokens may come next in one generation (a grammar): the engine masks the others.

    The engine asks ``fill_mask`` before each choice and reports the chosen token to
    ``accept``; a scripted source does the same. Reported logprobs are the model's own,
    *before* the mask (``nbresponses.runtime.sampling``).
    """

    @property
    def vocab_size(self) -> int:
        """Tokens the mask covers (ids at or above it are never allowed)."""
        ...

    def fill_mask(self, mask: Any) -> None:
        """Write the allowed next tokens into ``mask``, an int32 numpy array of
        ``(vocab_size + 31) // 32`` words, one bit per token id (bit ``i % 32`` of word
        ``i // 32``)."""
        ...

    def accept(self, token_id: int) -> None:
        """The token chosen (always one the last mask allowed)."""
        ...

    @property
    def error(self) -> str | None:
        """Why no token can follow, when the grammar reached a dead end (a bug or a limit)."""
        ...


@runtime_checkable
class ClosableConstraint(TokenConstraint, Protocol):
    """A constraint that can say how to finish from where it stands: the engine uses it to end
    a structured answer within its token budget (budget-aware closing, ``tokens/closing.py``).

    A constraint with a true attribute ``whole`` (optional) says an output cut short is worth
    nothing (a function call): the closing then keeps a way to the end within the budget at
    every step, and when none fits before the first token the source generates nothing and
    ends "length".
    """

    def closing(self, limit: int, after: int | None = None) -> Sequence[int] | None:
        """Token ids that reach the grammar's end from here (after the token ``after``, when
        given), the end token included (one id when it may end now); None when no way was
        found within ``limit`` steps (or ``after`` is not allowed)."""
        ...


ConstraintFactory = Callable[[], TokenConstraint]


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks its tokens. ``temperature == 0`` means greedy."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = no top-k cut
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    # Generate past the model's end-of-sequence tokens (``stop_token_ids`` still stop): fixed-
    # length answers for benchmarks and probes, as vLLM's ``ignore_eos``.
    ignore_eos: bool = False
    logprobs: bool = False  # compute the chosen token's logprob
    top_logprobs: int = 0  # 0..20 alternatives from the full-vocabulary log-softmax
    # Teacher forcing: emit these tokens in order instead of choosing (stop tokens do not end
    # it early); each step reports what the model gives them, exactly as if it had chosen them.
    forced_tokens: tuple[int, ...] = ()
    details: bool = False  # also the chosen token's rank and the distribution's entropy
    # also the whole next-token log-softmax (float32, vocabulary-sized): for analyses that
    # need every token's probability (word-start mass, full-vocabulary KL); costs a copy
    distribution: bool = False
    # Also each token's logprob under the distribution it was drawn from (after logit_bias,
    # the grammar mask, temperature, top-k, top-p): vLLM's ``logprobs_mode="processed_logprobs"``.
    processed_logprobs: bool = False
    # Token id -> a number added to its logit before every choice, greedy included (OpenAI's
    # ``logit_bias``: -100 bans a token, +100 makes it near-certain). Reported logprobs stay
    # the model's own; processed logprobs are those of the biased distribution drawn from.
    logit_bias: dict[int, float] | None = field(default=None, hash=False)
    # A grammar for the output: a fresh constraint per generation (ignored with forced_tokens).
    constraint: ConstraintFactory | None = field(default=None, compare=False)


@dataclass(frozen=True)
class TokenIdLogprob:
    """The chosen token's logprob and its top alternatives (token id, logprob), best first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    rank: int | None = None  # 1 = the most likely token (with ``details``)
    entropy: float | None = None  # of the full next-token distribution, nats (with ``details``)
    # the full log-softmax this token was drawn from (with ``distribution``; a numpy array)
    distribution: Any = field(default=None, compare=False, repr=False)
    # under the distribution the token was drawn from (with ``processed_logprobs``); equal to
    # ``logprob`` when nothing reshapes it (greedy or temperature 1, no top-k/top-p/grammar)
    processed: float | None = None


@dataclass(frozen=True)
class GenerationStats:
    """What the engine measured of one request, sent by value with its final ``Step``.

    Counts apart from seconds; the seconds are None when the request never reached that stage
    (a cancelled request never prefilled, a scoring job has no first token)."""

    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose KV was reused from an earlier request
    output_tokens: int = 0  # tokens generated (or scored)
    draft_tokens: int = 0  # speculation: drafted tokens verified by decode steps
    accepted_draft_tokens: int = 0  # of those, the ones the model chose too (kept)
    closing_tokens: int = 0  # choices budget-aware closing replaced (``tokens/closing.py``)
    guarded_tokens: int = 0  # choices made while a grammar's repetition guard banned one
    queued_s: float | None = None  # from submission to the start of its prefill
    prefill_s: float | None = None  # its prefill, up to the logits of the first token
    total_s: float | None = None  # from submission to the final step
    first_token_time: float | None = None  # time.perf_counter() when the first token was ready


@dataclass(frozen=True)
class Step:
    """What one request gets from one decode step (or the last, with a finish reason).

    ``token_ids`` are the tokens generated in this step (usually one; none on a pure finish).
    ``logprobs`` has one entry per token when the request asked for logprobs, else None.
    ``finish_reason`` is set on the last step only; ``error`` carries the message when it is
    "error", ``stats`` what the engine measured of the request (the last step only, too).
    """

    token_ids: tuple[int, ...]
    logprobs: tuple[TokenIdLogprob, ...] | None = None
    finish_reason: FinishReason | None = None
    error: str | None = None
    # budget-aware closing has replaced a choice of this generation (by this step): the budget,
    # not the model, shapes its end (``tokens/closing.py``)
    closed: bool = False
    stats: GenerationStats | None = field(default=None, compare=False)  # measures, not content


@runtime_checkable
class TokenStream(Protocol):
    """One request's steps, ending with the step that has a ``finish_reason``.

    ``cancel()`` asks the source to stop early: the stream then ends with a "cancelled" step
    (unless it had ended already), which carries the stats as any final step does.
    ``aclose()`` (or cancelling the consuming task) stops it without waiting for that step.
    """

    def __aiter__(self) -> TokenStream: ...

    async def __anext__(self) -> Step: ...

    def cancel(self) -> None: ...

    async def aclose(self) -> None: ...


async def stop_early(stream: TokenStream) -> GenerationStats | None:
    """Cancel a stream whose consumer needs no more tokens and read on to its final step, for
    the stats it carries (the steps before it are dropped)."""
    stream.cancel()
    async for step in stream:
        if step.finish_reason is not None:
            return step.stats
    return None


@runtime_checkable
class TokenSource(Protocol):
    """Anything that turns prompt token ids into a stream of steps: the engine or a script."""

    @property
    def eos_token_ids(self) -> Sequence[int]: ...

    @property
    def context_length(self) -> int: ...

    def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> TokenStream:
        """Stream the steps of one request. Cancelling the consuming task frees its batch row."""
        ...

    def stats(self) -> Mapping[str, Any]:
        """Figures worth showing a user (load, memory, cache hits) as JSON-ready values."""
        ...


class Tokenizer(Protocol):
    """What this package asks of a tokenizer: a transformers ``PreTrainedTokenizerBase`` is one.

    Families render and read text with it; the engine itself never needs one (it speaks ids).
    """

    @property
    def eos_token_id(self) -> int | None: ...

    @property
    def chat_template(self) -> str | None: ...

    def encode(self, text: str, *args: Any, **kwargs: Any) -> list[int]: ...

    def decode(self, token_ids: Any, *args: Any, **kwargs: Any) -> str: ...

    def convert_ids_to_tokens(self, ids: Any, *args: Any, **kwargs: Any) -> Any: ...

    def apply_chat_template(self, conversation: Any, *args: Any, **kwargs: Any) -> Any: ...

    def get_vocab(self) -> dict[str, int]: ...


@runtime_checkable
class ScoringSource(TokenSource, Protocol):
    """A token source that can also score given tokens in prefill runs (the ONNX generator)."""

    def score(
        self,
        token_ids: Sequence[int],
        *,
        start: int = 1,
        top_logprobs: int = 0,
        distribution: bool = False,
    ) -> TokenStream:
        """Logprobs of ``token_ids[start:]``, each given the tokens before it (with
        ``distribution``, each entry also carries its full log-softmax)."""
        ...
