"""The stats a token source gives by value on a request's final step, and what a response makes
of them: the scripted source's own, a stream stopped early, the counts of several rounds."""

from __future__ import annotations

from pathlib import Path

from helpers.responses import WEATHER
from helpers.server import ids, scripted, tool_call
from openai_harmony import Message, Role

from nbresponses.families.harmony import harmony_encoding
from nbresponses.families.harmony.family import HarmonyFamily
from nbresponses.service.client import AsyncResponsesClient
from nbresponses.tokens.contract import SamplingParams, TokenStream, stop_early
from nbresponses.tokens.scripted import Script, ScriptedTokenSource

GPT_OSS_EOS = (200002, 199999, 200012)  # <|return|>, <|endoftext|>, <|call|>


async def test_only_the_final_step_carries_the_stats() -> None:
    source = ScriptedTokenSource([Script([5, 6, 7, 2], cached_tokens=3)])
    stream = source.generate([1, 2, 3, 4], SamplingParams(max_tokens=10))
    assert isinstance(stream, TokenStream)
    steps = [step async for step in stream]
    assert [s.stats for s in steps[:-1]] == [None] * 3
    stats = steps[-1].stats
    assert steps[-1].finish_reason == "stop" and stats is not None
    assert (stats.prompt_tokens, stats.cached_tokens, stats.output_tokens) == (4, 3, 4)
    assert stats.first_token_time is not None


async def test_a_stream_stopped_early_still_gives_its_stats() -> None:
    source = ScriptedTokenSource([Script([5, 6, 7, 8, 9], cached_tokens=2)])
    stream = source.generate([1, 2, 3], SamplingParams(max_tokens=10))
    first = await anext(stream)
    assert first.token_ids == (5,) and first.stats is None
    stats = await stop_early(stream)
    assert stats is not None
    assert (stats.prompt_tokens, stats.cached_tokens, stats.output_tokens) == (3, 2, 1)
    assert source.cancelled == 1


async def test_one_function_call_stops_the_generation_and_keeps_the_engine_counts(
    tokenizer,
) -> None:
    """The output reader stops the round after one call; usage keeps the engine's cached count."""
    call = tool_call("get_weather", {"city": "Bern"})
    script = Script(ids(tokenizer, call + "\n" + call), cached_tokens=5)
    client, source = scripted(tokenizer, script)
    r = await client.responses.create(input="q", tools=[WEATHER], parallel_tool_calls=False)
    assert len(r.output) == 1 and r.status == "completed"
    assert source.cancelled == 1
    assert r.usage.input_tokens_details.cached_tokens == 5
    assert "first_token_s" in client.store.get(r.id).run.timings


class _Search:
    """A browser backend that answers every search with one line."""

    async def search(self, query: str, *, topn: int = 10) -> str:
        return f"[0] results for {query}"

    async def open(self, target: str | int, **kw: int) -> str:
        return ""

    async def find(self, pattern: str, *, cursor: int = -1) -> str:
        return ""


def _assistant(enc, *messages: Message) -> list[int]:
    """What a gpt-oss model generates after ``<|start|>assistant`` (a final ends <|return|>)."""
    out = [t for m in messages for t in enc.render(m)][2:]
    if messages[-1].channel == "final":
        out[-1] = GPT_OSS_EOS[0]
    return out


async def test_the_counts_add_over_the_rounds_of_a_response(cache_dir: Path) -> None:
    """A gpt-oss response that searches twice runs three engine requests: its usage adds each
    one's prompt, cached and output tokens, as their final steps gave them."""
    enc = harmony_encoding(cache_dir)

    def msg(text: str, channel: str, recipient: str | None = None) -> Message:
        m = Message.from_role_and_content(Role.ASSISTANT, text).with_channel(channel)
        return m.with_recipient(recipient) if recipient else m

    search = msg('{"query": "x"}', "analysis", "browser.search")
    rounds = [
        _assistant(enc, msg("Look it up.", "analysis"), search),
        _assistant(enc, search),
        _assistant(enc, msg("Found.", "final")),
    ]
    cached = [0, 30, 60]
    source = ScriptedTokenSource(
        [Script(r, cached_tokens=c) for r, c in zip(rounds, cached, strict=True)],
        eos_token_ids=GPT_OSS_EOS,
    )
    family = HarmonyFamily(enc, eos_token_ids=GPT_OSS_EOS, browser=_Search())
    client = AsyncResponsesClient(source, None, model="gpt-oss-tiny", family=family)
    r = await client.responses.create(input="Look it up", tools=[{"type": "web_search"}])
    assert r.status == "completed" and r.output_text == "Found."
    assert len(source.prompts) == 3
    assert r.usage.input_tokens == sum(len(p) for p in source.prompts)
    assert r.usage.input_tokens_details.cached_tokens == sum(cached)
    assert r.usage.output_tokens == sum(len(t) for t in rounds)
