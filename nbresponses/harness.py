"""lm-evaluation-harness on the in-kernel engine: ``EngineLM(engine)``, registered as
``"nbresponses"``.

``lm_eval.simple_evaluate(model=nbr.harness.EngineLM(engine), tasks=[...])`` runs a task in a
notebook on an engine already loaded (``model="nbresponses"`` with ``model_args="model=...,
quantization=..."`` loads one). Its requests are the harness's own three:

- ``loglikelihood``: the harness tokenizes (its ``_encode_pair``, with our tokenizer), and each
  continuation is scored after its context by ``Scorer.logprobs``: the engine's scoring, the
  numbers ``/v1/completions`` returns to ``local-completions`` for the same ids;
- ``loglikelihood_rolling``: the text in the harness's own rolling windows (``max_length``,
  by default local-completions' 2048), after its prefix token (the tokenizer's BOS when it
  has one, else the end-of-text token: the harness's rule);
- ``generate_until``: the Completions API's generation, cut at the first ``until`` string.

The engine is batch-invariant, so ``batch_size`` (how many requests are in flight at once)
changes the speed, never a number. The harness calls are blocking; the engine's work runs on a
loop thread of its own, so they can be called from a notebook cell.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from typing import Any, TypeVar

import lm_eval.models  # noqa: F401  # the harness's own models first: it loads them only
from lm_eval import utils as lm_utils  # into an empty registry, and ours would fill it
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from tqdm.auto import tqdm

from nbresponses.engine import Engine
from nbresponses.server.loops import LoopThread
from nbresponses.service.scoring import Method, Scoring

T = TypeVar("T")
R = TypeVar("R")
HARNESS_MAX_LENGTH = 2048  # local-completions' default max_length


@register_model("nbresponses")
class EngineLM(TemplateLM):
    """An lm-evaluation-harness model on a loaded ``nbr.Engine``."""

    backend = "causal"

    def __init__(
        self,
        engine: Engine | None = None,
        *,
        model: str | None = None,
        quantization: str | None = None,
        batch_size: int | str = 1,
        method: Method = "prefill",
        max_length: int | None = None,
        max_gen_toks: int = 256,
        cache_dir: str | None = None,
        **_: Any,
    ) -> None:
        """``engine``: one already loaded, or ``model`` / ``quantization`` (/ ``cache_dir``) to
        load (as ``nbr.Engine.load``); ``method``: how scorings are computed ("prefill", the fast
        way, as ``/v1/completions`` does by default; or "decode")."""
        super().__init__()
        self._loop = LoopThread("nbresponses-harness")
        self._owned = engine is None
        self.engine = (
            engine
            if engine is not None
            else self._run(Engine.load(model, quantization, cache_dir=cache_dir))
        )
        self.method: Method = method
        self.batch_size = max(1, int(batch_size)) if str(batch_size) != "auto" else 8
        context = self.engine.generator.context_length
        # one token kept for generation, as local-completions does (its max_length - 1)
        self.max_length = (max_length or min(HARNESS_MAX_LENGTH, context)) - 1
        self.max_gen_toks = max_gen_toks
        self._family = self.engine.client().family

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.submit(coro).result()

    def _many(
        self,
        items: Sequence[T],
        work: Callable[[T], Awaitable[R]],
        desc: str,
        disable_tqdm: bool,
    ) -> list[R]:
        """``work`` on every item, ``batch_size`` at a time, results in order, with a bar."""

        async def run_all() -> list[R]:
            gate = asyncio.Semaphore(self.batch_size)
            bar = tqdm(total=len(items), desc=desc, disable=disable_tqdm)

            async def one(item: T) -> R:
                async with gate:
                    result = await work(item)
                bar.update(1)
                return result

            try:
                return list(await asyncio.gather(*(one(item) for item in items)))
            finally:
                bar.close()

        return self._run(run_all())

    # -- what the harness asks of a TemplateLM -------------------------------------------------

    @property
    def eot_token_id(self) -> int:
        return int(self.engine.generator.eos_token_ids[0])

    @property
    def prefix_token_id(self) -> int:
        """What an empty context and rolling windows start from: the tokenizer's BOS when it
        has one, else the end-of-text token (the harness's own rule, so local-completions and
        this model score the same ids)."""
        bos = getattr(self.engine.tokenizer, "bos_token_id", None)
        return int(bos) if bos is not None else self.eot_token_id

    def tok_encode(self, string: str, **kwargs: Any) -> list[int]:
        return self._family.encode(string)

    def tok_decode(self, tokens: Iterable[int], **kwargs: Any) -> str:
        return self._family.decode(list(tokens))

    async def _score(self, context: list[int], continuation: list[int]) -> tuple[float, bool]:
        """Summed logprob of ``continuation`` after ``context`` and whether each of its tokens
        is the model's first choice (as local-completions reads ``logprobs=1``)."""
        inp = (context + continuation)[-self.max_length :]  # left-truncated, as the harness
        ctxlen = len(context) - max(0, len(context) + len(continuation) - self.max_length)
        scorer = self.engine.scoring.scorer
        logprobs, _ = await scorer.logprobs(
            Scoring(inp[:ctxlen], inp[ctxlen:]), top_logprobs=1, method=self.method
        )
        greedy = all(lp.logprob >= lp.top[0][1] for lp in logprobs)
        return float(sum(lp.logprob for lp in logprobs)), greedy

    def _loglikelihood_tokens(
        self, requests: Sequence[Any], disable_tqdm: bool = False, **kwargs: Any
    ) -> list[tuple[float, bool]]:
        results = self._many(
            list(requests),
            lambda request: self._score(list(request[1]), list(request[2])),
            "scoring",
            disable_tqdm,
        )
        for request, result in zip(requests, results, strict=True):
            if request[0] is not None:
                self.cache_hook.add_partial("loglikelihood", request[0], result)
        return results

    def loglikelihood_rolling(
        self, requests: Sequence[Any], disable_tqdm: bool = False
    ) -> list[float]:
        async def rolling(string: str) -> float:
            windows = map(
                lm_utils.make_disjoint_window,
                lm_utils.get_rolling_token_windows(
                    token_list=self.tok_encode(string),
                    prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length - 1,
                    context_len=1,
                ),
            )
            scores = [await self._score(list(c), list(t)) for c, t in windows]
            return float(sum(s for s, _ in scores))

        strings = [request.args[0] for request in requests]
        results = self._many(strings, rolling, "rolling loglikelihood", disable_tqdm)
        for string, result in zip(strings, results, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", (string,), result)
        return results

    def generate_until(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[str]:
        completions = self.engine.client().completions

        async def generate(args: tuple[str, dict[str, Any]]) -> str:
            context, options = args
            options = dict(options)
            until = options.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            max_tokens = int(options.pop("max_gen_toks", self.max_gen_toks))
            sample = options.pop("do_sample", False)
            temperature = float(options.pop("temperature", 1.0 if sample else 0.0))
            completion = await completions.create(
                model=self.engine.model,
                prompt=context,
                max_tokens=max_tokens,
                temperature=temperature if sample or temperature else 0.0,
                stop=until[:4] or None,  # OpenAI's limit; the rest are cut below
            )
            text = completion.choices[0].text  # type: ignore[union-attr]
            for stop in until[4:]:
                text = text.split(stop)[0]
            return text

        arguments = [request.args for request in requests]
        results = self._many(arguments, generate, "generating", disable_tqdm)
        for args, result in zip(arguments, results, strict=True):
            self.cache_hook.add_partial("generate_until", args, result)
        return results

    def close(self) -> None:
        """Stop the loop thread (and the engine, when this model loaded it)."""
        if self._owned:
            self._run(self.engine.aclose())
        self._loop.close()
