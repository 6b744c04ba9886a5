"""An agent framework that speaks the Responses API runs a tool-using agent against us.

openai-agents' ``OpenAIResponsesModel`` drives the real openai SDK; the scripted model first
writes a Hermes ``<tool_call>`` (through the real SmolLM2 tokenizer), the framework runs the
Python tool and sends its output back, and the second script is the final answer.
"""

from __future__ import annotations

import pytest
from helpers.responses import MODEL
from helpers.server import Target, scripted, tool_call

agents = pytest.importorskip("agents")

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _no_tracing():
    agents.set_tracing_disabled(True)  # tracing would export to OpenAI's servers
    yield


@pytest.mark.parametrize("kind", ["inprocess", "http"])
@pytest.mark.parametrize("streamed", [False, True])
async def test_openai_agents_tool_agent_runs_to_completion(tokenizer, kind, streamed):
    client, source = scripted(
        tokenizer,
        tool_call("get_weather", {"city": "Oslo"}),
        "The weather in Oslo is sunny, 21C.",
    )
    calls: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"sunny, 21C in {city}"

    with Target(kind, client) as target:
        model = agents.OpenAIResponsesModel(model=MODEL, openai_client=target.openai())
        agent = agents.Agent(
            name="weather", instructions="Answer with the tool.", model=model, tools=[get_weather]
        )
        if streamed:
            run = agents.Runner.run_streamed(agent, "Weather in Oslo?")
            kinds = [event.type async for event in run.stream_events()]
            assert "raw_response_event" in kinds
            result = run
        else:
            result = await agents.Runner.run(agent, "Weather in Oslo?")
    assert calls == ["Oslo"]
    assert result.final_output == "The weather in Oslo is sunny, 21C."
    second_prompt = tokenizer.decode(source.prompts[1])
    assert "sunny, 21C in Oslo" in second_prompt and "get_weather" in second_prompt
