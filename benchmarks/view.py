"""What the live view costs per stream event, against a 60 tok/s generation.

Run: python benchmarks/view.py [--events 1000] [--rounds 7]

The view consumes an async stream that yields at once (no model), so every microsecond
measured is the view's: folding, patch coalescing, flush scheduling and the JSON encoding of
each flushed patch (standing in for the kernel's comm). The same stream consumed by a bare
``async for`` is the baseline and is subtracted. A paced run then streams at 60 tok/s with and
without the view and compares the CPU time the process used.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from openai._models import construct_type
from openai.types.responses import ResponseStreamEvent

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, uninstalled
from nbresponses.view import ResponseView

TOK_PER_S = 60.0


def make_events(n: int, logprobs: int = 0) -> list[dict[str, Any]]:
    """``response.created`` .. ``response.completed`` around ``n`` text deltas."""
    item = {"type": "message", "id": "msg", "role": "assistant", "status": "in_progress"}
    part = {"type": "output_text", "text": "", "annotations": []}
    events: list[dict[str, Any]] = [
        {
            "type": "response.created",
            "response": {"id": "r", "status": "in_progress", "output": []},
        },
        {"type": "response.output_item.added", "output_index": 0, "item": {**item, "content": []}},
        {
            "type": "response.content_part.added",
            "output_index": 0,
            "content_index": 0,
            "part": part,
        },
    ]
    for i in range(n):
        delta: dict[str, Any] = {
            "type": "response.output_text.delta",
            "item_id": "msg",
            "output_index": 0,
            "content_index": 0,
            "delta": f" tok{i % 97}",
            "sequence_number": i + 3,
            "logprobs": [],
        }
        if logprobs:
            top = [{"token": f" alt{k}", "logprob": -0.1 * (k + 1)} for k in range(logprobs)]
            delta["logprobs"] = [{"token": delta["delta"], "logprob": -0.1, "top_logprobs": top}]
        events.append(delta)
    text = "".join(e["delta"] for e in events[3:])
    done = {**item, "status": "completed", "content": [{**part, "text": text}]}
    events.append({"type": "response.output_item.done", "output_index": 0, "item": done})
    events.append(
        {
            "type": "response.completed",
            "response": {"id": "r", "status": "completed", "output": [done]},
        }
    )
    return events


async def _iterate(events: list[Any], delay: float = 0.0) -> AsyncIterator[Any]:
    for event in events:
        yield event
        if delay:
            await asyncio.sleep(delay)
        else:
            await asyncio.sleep(0)  # hand the loop over, as a real stream does


async def _bare(events: list[Any]) -> None:
    async for _ in _iterate(events):
        pass


async def _viewed(events: list[Any]) -> ResponseView:
    view = ResponseView(_iterate(events))
    view._post = lambda msg: json.dumps(msg)  # type: ignore[method-assign]
    await view
    return view


def per_event_us(events: list[Any], rounds: int) -> float:
    """Median over rounds of (view time - bare time) / events, in microseconds."""
    costs = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        asyncio.run(_bare(events))
        t1 = time.perf_counter()
        asyncio.run(_viewed(events))
        t2 = time.perf_counter()
        costs.append(((t2 - t1) - (t1 - t0)) / len(events) * 1e6)
    return statistics.median(costs)


async def _paced_cpu(events: list[Any], with_view: bool) -> float:
    delay = 1 / TOK_PER_S
    c0 = time.process_time()
    if with_view:
        view = ResponseView(_iterate(events, delay))
        view._post = lambda msg: json.dumps(msg)  # type: ignore[method-assign]
        await view
    else:
        async for _ in _iterate(events, delay):
            pass
    return time.process_time() - c0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--paced-events", type=int, default=120)
    args = parser.parse_args()

    plain = make_events(args.events)
    cases = {
        "dict events": plain,
        "dict events + top-5 logprobs": make_events(args.events, logprobs=5),
        "openai SDK event models": [
            construct_type(type_=ResponseStreamEvent, value=e) for e in plain
        ],
    }
    generation = len(plain) / TOK_PER_S
    print(
        f"{len(plain)} events; a {TOK_PER_S:.0f} tok/s generation of them takes {generation:.1f} s"
    )
    print(f"{'case':32} {'µs/event':>9} {'view total':>11} {'vs generation':>14}")
    for name, events in cases.items():
        us = per_event_us(events, args.rounds)
        total = us * len(events) / 1e6
        print(f"{name:32} {us:9.1f} {total * 1e3:9.1f} ms {total / generation:13.3%}")

    paced = make_events(args.paced_events)
    bare = asyncio.run(_paced_cpu(paced, with_view=False))
    viewed = asyncio.run(_paced_cpu(paced, with_view=True))
    wall = len(paced) / TOK_PER_S
    print(
        f"paced at {TOK_PER_S:.0f} tok/s, {len(paced)} events ({wall:.1f} s): CPU bare "
        f"{bare * 1e3:.1f} ms, with view {viewed * 1e3:.1f} ms; the view's share of the "
        f"generation time: {(viewed - bare) / wall:.3%}"
    )
    view = asyncio.run(_viewed(plain))
    assert view.response.output_text == plain[-1]["response"]["output"][0]["content"][0]["text"]


if __name__ == "__main__":
    main()
