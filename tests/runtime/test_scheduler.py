"""The scheduler's admission policy on a fake runner, in milliseconds: which queued requests join
the batch (FIFO, the first that does not fit ends the round, a request alone always runs), the
batch size and KV budget (rows x the longest reservation), what takes no row (scoring jobs,
cancelled requests), and the order of a round's prefills (shortest first, identical prompts
once). The real engine's versions of these run in test_generator.py."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from nbresponses.runtime.kv import KVLayout
from nbresponses.runtime.prefix_cache import PrefixCache
from nbresponses.runtime.scheduler import GenerateRequest, Queued, Scheduler, ScoreRequest
from nbresponses.tokens.contract import SamplingParams, Step

VOCAB = 8
NEXT = 5  # the token every step chooses: never a stop token, so max_tokens ends each request
LAYOUT = KVLayout.uniform(
    ("past.0",), ("present.0",), kv_heads=1, head_dim=1, dtype=np.dtype("float32")
)
PER_TOKEN = LAYOUT.bytes_per_token  # 4 bytes of KV a token


class FakeRunner:
    """Stands in for ``OnnxRunner`` (``kv.Runner``, and what the scheduler reads of a runner):
    one KV float a token, holding the id of the request it belongs to (its prompt's first
    token), logits that always choose ``NEXT``, and a log of the runs: ("prefill" | "decode",
    request, the decode steps run before it)."""

    kv_in_place = False  # ``kv.SeparateKV``: a run per row, so each run names its request
    exact_steps = False
    reads_every_column = False  # exact steps only (no speculation here)
    layout = LAYOUT
    token_stats = None  # logprobs from numpy's code
    threads = 1

    def __init__(self) -> None:
        self.scheduler: Scheduler | None = None
        self.log: list[tuple[str, int, int]] = []

    def run(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        position_ids: np.ndarray,
        past: list[Any],
        *,
        in_place: bool = False,
        position: int | None = -1,
        keep: int = 0,  # ignored: every position, as a graph that cannot skip any
    ) -> tuple[np.ndarray, list[Any]]:
        assert self.scheduler is not None
        count = input_ids.shape[1]
        held = np.asarray(past[0])
        owner = int(held[0, 0, 0, 0]) if held.shape[2] else int(input_ids[0, 0])
        kind = "decode" if held.shape[2] and count == 1 else "prefill"
        self.log.append((kind, owner, self.scheduler.steps))
        present = [np.concatenate([held, np.full((1, 1, count, 1), owner, np.float32)], axis=2)]
        logits = np.zeros((1, count, VOCAB), np.float32)
        logits[..., NEXT] = 1.0
        return (logits[0] if position is None else logits[:, position]), present

    def prefills(self) -> list[tuple[int, int]]:
        """(request, decode steps run before its prefill), in the order of the prefills."""
        return [(owner, step) for kind, owner, step in self.log if kind == "prefill"]

    def batches(self) -> list[set[int]]:
        """The requests each decode step ran."""
        steps: dict[int, set[int]] = {}
        for kind, owner, step in self.log:
            if kind == "decode":
                steps.setdefault(step, set()).add(owner)
        return [steps[s] for s in sorted(steps)]


class Job:
    """A greedy request whose prompt starts with ``name`` (the fake runner's id for it), and
    the steps its sink received."""

    def __init__(self, name: int, length: int, max_tokens: int, *, score: bool = False) -> None:
        self.steps: list[Step] = []
        self.done = threading.Event()
        prompt = (name, *[1] * (length - 1))
        self.request: Queued
        if score:  # a scoring job: the logprobs of prompt[1:]
            self.request = ScoreRequest(prompt=prompt, sink=self._sink, start=1)
        else:
            self.request = GenerateRequest(
                prompt=prompt,
                sink=self._sink,
                params=SamplingParams(max_tokens=max_tokens, temperature=0),
                budget_tokens=length + max_tokens,
            )

    def _sink(self, step: Step) -> None:
        self.steps.append(step)
        if step.finish_reason is not None:
            self.done.set()


@pytest.fixture
def start() -> Iterator[Any]:
    """``start(jobs, **limits)``: a scheduler on a fake runner, the jobs queued at once (one
    admission round sees them all); returns the runner when every job has finished."""
    made: list[Scheduler] = []

    def run(jobs: list[Job], *, max_batch_size: int = 16, kv_budget_bytes: int = 1 << 20):
        runner = FakeRunner()
        scheduler = Scheduler(
            runner,
            stop_ids=(0,),
            context_length=1000,
            max_batch_size=max_batch_size,
            kv_budget_bytes=kv_budget_bytes,
            prefix_cache=PrefixCache(0),
        )
        runner.scheduler = scheduler
        made.append(scheduler)
        scheduler.submit_many([j.request for j in jobs])
        for j in jobs:
            assert j.done.wait(10), f"request {j.request.prompt[0]} did not finish"
        return runner

    yield run
    for scheduler in made:
        scheduler.close(10)


def test_a_round_takes_requests_in_order_while_the_batch_has_room(start):
    jobs = [Job(name, 4, max_tokens=3) for name in (10, 11, 12, 13)]
    runner = start(jobs, max_batch_size=2)
    # 10 and 11 fill the batch; each decodes twice after its prefill's token and leaves
    assert runner.prefills() == [(10, 0), (11, 0), (12, 2), (13, 2)]
    assert runner.batches() == [{10, 11}, {10, 11}, {12, 13}, {12, 13}]
    assert all(j.steps[-1].finish_reason == "length" and len(j.steps) == 3 for j in jobs)


def test_the_kv_budget_holds_rows_times_the_longest_reservation(start):
    """Two rows of 10 tokens fit 80 bytes, a third does not; a row reserving 20 tokens next to
    one of 10 costs 2 x 20 tokens (a short row is padded to the longest), not 10 + 20."""
    runner = start([Job(n, 4, max_tokens=6) for n in (10, 11, 12)], kv_budget_bytes=80)
    assert runner.prefills() == [(10, 0), (11, 0), (12, 5)]
    budget = 30 * PER_TOKEN  # the sum (120 bytes) fits, rows x longest (160) does not
    runner = start([Job(20, 4, max_tokens=6), Job(21, 4, max_tokens=16)], kv_budget_bytes=budget)
    assert runner.prefills() == [(20, 0), (21, 5)]
    assert max(len(batch) for batch in runner.batches()) == 1


def test_a_request_alone_always_runs(start):
    """Above any budget, a request runs when the batch is empty, and only then."""
    runner = start([Job(n, 6, max_tokens=2) for n in (10, 11, 12)], kv_budget_bytes=0)
    assert runner.prefills() == [(10, 0), (11, 1), (12, 2)]
    assert runner.batches() == [{10}, {11}, {12}]


def test_the_first_request_that_does_not_fit_ends_the_round(start):
    """A small request behind a large one waits, though it would fit: nobody starves."""
    jobs = [Job(10, 4, max_tokens=6), Job(11, 4, max_tokens=26), Job(12, 4, max_tokens=6)]
    runner = start(jobs, kv_budget_bytes=2 * 10 * PER_TOKEN)  # 10 and 12 would fit together
    assert [name for name, _ in runner.prefills()] == [10, 11, 12]
    assert runner.batches() == [{10}] * 5 + [{11}] * 25 + [{12}] * 5


def test_scoring_jobs_and_cancelled_requests_take_no_row(start):
    """A scoring job runs in the round that takes it (its prefill runs are all it needs) and a
    cancelled request just ends there; neither counts against the batch: the last request
    still joins the first one's batch of two."""
    cancelled = Job(12, 4, max_tokens=3)
    cancelled.request.cancelled = True
    scoring = Job(11, 6, max_tokens=5, score=True)
    runner = start(
        [Job(10, 4, max_tokens=3), scoring, cancelled, Job(13, 4, max_tokens=3)], max_batch_size=2
    )
    assert runner.prefills() == [(10, 0), (13, 0), (11, 0)]  # shortest first; 12 never ran
    assert runner.batches() == [{10, 13}, {10, 13}]
    assert [s.finish_reason for s in cancelled.steps] == ["cancelled"]
    assert [t for s in scoring.steps for t in s.token_ids] == [1] * 5  # the given tokens
    assert scoring.steps[-1].finish_reason == "length"


def test_a_round_prefills_its_shortest_prompts_first(start):
    """Taken in arrival order, prefilled shortest first (arrival order among equals): the
    short prompts' first tokens come sooner, the long one's no later than its turn."""
    jobs = [Job(10, 12, max_tokens=2), Job(11, 4, max_tokens=2), Job(12, 4, max_tokens=2)]
    runner = start(jobs)
    assert runner.prefills() == [(11, 0), (12, 0), (10, 0)]
    assert runner.batches() == [{10, 11, 12}]


def test_identical_prompts_in_a_round_share_one_prefill(start):
    twins = [Job(10, 6, max_tokens=3) for _ in range(3)]
    runner = start(twins)
    assert runner.prefills() == [(10, 0)]  # one run of six tokens for the three of them
    assert [len(j.steps) for j in twins] == [3, 3, 3]
    decodes = [(owner, step) for kind, owner, step in runner.log if kind == "decode"]
    assert decodes == [(10, 0)] * 3 + [(10, 1)] * 3  # three rows, each with the prompt's KV
