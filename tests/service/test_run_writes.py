"""A ``ResponseRun`` is the one writer of its response and its event log: no client needed."""

from __future__ import annotations

import pytest
from helpers.responses import check_stream, client_for, fold, ids
from openai.types.responses import Response

from nbresponses.families.registry import select_family
from nbresponses.protocol.request import parse_create
from nbresponses.service.codec import from_rows
from nbresponses.service.run import Generation, ResponseRun
from nbresponses.tokens.contract import SamplingParams
from nbresponses.tokens.scripted import ScriptedTokenSource

ANSWER = "Hello there, friend."


@pytest.mark.parametrize("background", [False, True])
async def test_a_run_alone_writes_every_event_of_its_log(tokenizer, background):
    source = ScriptedTokenSource([ids(tokenizer, ANSWER)])
    family = select_family("chat", source=source, tokenizer=tokenizer)
    req = parse_create({"input": "hi", "background": background}, model="m")
    prompt = family.render(req, req.input)
    params = SamplingParams(max_tokens=64, stop_token_ids=prompt.stop_token_ids)
    response = Response(
        id="resp_1", object="response", created_at=0, model="m", status="in_progress",
        output=[], background=background, parallel_tool_calls=True, tool_choice="auto", tools=[],
    )  # fmt: skip
    settled: list[tuple[bool, list]] = []  # what the callback saw: done yet, the log
    run = ResponseRun(
        response,
        Generation(source, prompt.ids, params, prompt.output_reader),
        on_done=lambda r: settled.append((r.done.is_set(), list(r.events))),
    )
    first = ["response.created", *(["response.queued"] if background else [])]
    assert [e.type for e in run.events] == first  # announced as it is made
    reader = run.follow()  # holds the log from here, as a create's own stream does
    run.start()
    events = [e async for e in reader]
    check_stream(events)  # sequence numbers 0..n: one builder, the run's
    types = [e.type for e in events]
    assert types[: len(first) + 1] == [*first, "response.in_progress"]
    assert "response.output_text.delta" in types and types[-1] == "response.completed"
    assert fold(events).output_text == ANSWER
    assert events[-1].response == run.response  # the log's last word is the response
    kept = events if background else []  # only a background response replays
    assert run.events == kept
    assert settled == [(False, kept)]  # told before anyone sees it done, log already settled


async def test_a_restored_run_equals_the_stored_one(tokenizer, tmp_path):
    path = tmp_path / "responses.sqlite3"
    client, _ = client_for(tokenizer, ANSWER, "Second.", store_path=path)
    made = []
    for background in (True, False):
        r = await client.responses.create(input="hi", background=background)
        made.append(client.store.get(r.id).run)
        await made[-1].wait()
    assert client.flush()
    for run in made:
        rows = client.store.database.load(run.id, chain=False)
        back = from_rows(rows, chain=False).run
        assert back.done.is_set() and back.task is None  # finished: nothing to generate
        assert back.response == run.response and back.timings == run.timings
        assert back.events == run.events and back.replay == run.replay
        assert [e async for e in back.follow()] == run.events  # replays, ends at once
    assert [e.sequence_number for e in made[0].events] == list(range(len(made[0].events)))
    assert made[0].events and not made[1].events  # the background one kept its log
    client.close()
