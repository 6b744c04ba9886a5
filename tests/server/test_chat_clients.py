"""The clients people already use speak Chat Completions to ``nbresponses serve``: langchain's
``ChatOpenAI``, litellm's ``openai/...`` models, pydantic-ai's ``OpenAIChatModel`` and
openai-agents' ``OpenAIChatCompletionsModel``, each in its default (chat) mode, over HTTP.

The scripted tests (the real SmolLM2 tokenizer, a scripted model) check what each client
reads back, exactly; the ``integration`` tests run the same calls on the bundled model.
"""

from __future__ import annotations

import json
import os

import pydantic
import pytest
from helpers.responses import MODEL
from helpers.server import Target, ThreadedServer, scripted, tool_call

from nbresponses.engine import Engine
from nbresponses.runtime.generator import TokenGenerator

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm: no download at import

pytestmark = pytest.mark.timeout(180)
QUESTION = "What is the weather in Oslo?"


class City(pydantic.BaseModel):
    name: str
    country: str


def required(call: str) -> str:
    """What the model writes with tool_choice "required": the prompt opened the call."""
    return call.removeprefix("<tool_call>\n")


def get_weather(city: str) -> str:
    """Current weather for a city."""
    return f"sunny, 21C in {city}"


# -- langchain --------------------------------------------------------------------------------


def langchain_model(server: ThreadedServer, model: str = MODEL, **options):
    langchain_openai = pytest.importorskip("langchain_openai")
    return langchain_openai.ChatOpenAI(
        model=model, base_url=server.base_url, api_key="unused", max_retries=0, **options
    )


def test_langchain_invoke_stream_and_logprobs(tokenizer):
    answer = "Oslo is sunny today."
    client, _ = scripted(tokenizer, answer, answer, answer)
    with ThreadedServer(client) as server:
        llm = langchain_model(server)
        assert llm.invoke(QUESTION).content == answer
        assert "".join(chunk.content for chunk in llm.stream(QUESTION)) == answer
        message = llm.bind(logprobs=True, top_logprobs=2).invoke(QUESTION)
    tokens = message.response_metadata["logprobs"]["content"]
    assert "".join(t["token"] for t in tokens) == answer
    assert all(len(t["top_logprobs"]) == 2 for t in tokens)
    assert message.response_metadata["finish_reason"] == "stop"


def test_langchain_bind_tools_and_structured_output(tokenizer):
    client, source = scripted(
        tokenizer,
        tool_call("get_weather", {"city": "Oslo"}),
        '{"name": "Oslo", "country": "Norway"}',
    )
    with ThreadedServer(client) as server:
        llm = langchain_model(server)
        message = llm.bind_tools([get_weather]).invoke(QUESTION)
        city = llm.with_structured_output(City).invoke("Where is Oslo?")
    assert message.tool_calls[0]["name"] == "get_weather"
    assert message.tool_calls[0]["args"] == {"city": "Oslo"}
    assert city == City(name="Oslo", country="Norway")
    assert source.params[1].constraint is not None  # json_schema: held to the schema


async def test_langchain_astream_with_usage(tokenizer):
    answer = "It is sunny."
    client, source = scripted(tokenizer, answer)
    with ThreadedServer(client) as server:
        llm = langchain_model(server, stream_usage=True)
        chunks = [chunk async for chunk in llm.astream(QUESTION)]
    assert "".join(c.content for c in chunks) == answer
    usage = [c.usage_metadata for c in chunks if c.usage_metadata]
    assert usage and usage[-1]["input_tokens"] == len(source.prompts[0])


# -- litellm ----------------------------------------------------------------------------------


def litellm_call(server: ThreadedServer, model: str = MODEL, **kwargs):
    litellm = pytest.importorskip("litellm")
    return litellm.completion(
        model=f"openai/{model}", api_base=server.base_url, api_key="unused", **kwargs
    )


@pytest.mark.slow  # importing litellm takes seconds
def test_litellm_completion_with_logprobs_and_stream(tokenizer):
    answer = "Oslo is sunny."
    client, _ = scripted(tokenizer, answer, answer)
    messages = [{"role": "user", "content": QUESTION}]
    with ThreadedServer(client) as server:
        done = litellm_call(server, messages=messages, logprobs=True, top_logprobs=2,
                            max_tokens=30)  # fmt: skip
        chunks = list(litellm_call(server, messages=messages, stream=True, max_tokens=30))
    assert done.choices[0].message.content == answer
    tokens = done.choices[0].logprobs["content"]
    assert "".join(t["token"] for t in tokens) == answer
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == answer
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["stop"]


def test_litellm_tools(tokenizer):
    client, _ = scripted(tokenizer, required(tool_call("get_weather", {"city": "Oslo"})))
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": schema}}]
    with ThreadedServer(client) as server:
        done = litellm_call(server, messages=[{"role": "user", "content": QUESTION}],
                            tools=tools, tool_choice="required")  # fmt: skip
    (call,) = done.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo"}
    assert done.choices[0].finish_reason == "tool_calls"


# -- pydantic-ai ------------------------------------------------------------------------------


def pydantic_ai_agent(target_openai, output_type, model_name: str = MODEL):
    pydantic_ai = pytest.importorskip("pydantic_ai")
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel(model_name, provider=OpenAIProvider(openai_client=target_openai))
    return pydantic_ai.Agent(model, output_type=output_type, tools=[get_weather])


@pytest.mark.parametrize("kind", ["inprocess", "http"])
async def test_pydantic_ai_agent_with_a_tool_and_a_typed_output(tokenizer, kind):
    client, source = scripted(  # a typed output: pydantic-ai sends tool_choice="required"
        tokenizer,
        required(tool_call("get_weather", {"city": "Oslo"})),
        required(tool_call("final_result", {"name": "Oslo", "country": "Norway"})),
    )
    with Target(kind, client) as target:
        agent = pydantic_ai_agent(target.openai(), City)
        result = await agent.run("Where is Oslo, and what is its weather?")
    assert result.output == City(name="Oslo", country="Norway")
    assert "sunny, 21C in Oslo" in tokenizer.decode(source.prompts[1])


async def test_pydantic_ai_streams_text(tokenizer):
    client, _ = scripted(tokenizer, "Oslo is in Norway.")
    with Target("http", client) as target:
        agent = pydantic_ai_agent(target.openai(), str)
        async with agent.run_stream("Where is Oslo?") as run:
            text = await run.get_output()
    assert text == "Oslo is in Norway."


# -- openai-agents ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["inprocess", "http"])
@pytest.mark.parametrize("streamed", [False, True])
async def test_openai_agents_chat_completions_model(tokenizer, kind, streamed):
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)  # tracing would export to OpenAI's servers
    client, source = scripted(
        tokenizer, tool_call("get_weather", {"city": "Oslo"}), "It is sunny, 21C in Oslo."
    )
    with Target(kind, client) as target:
        model = agents.OpenAIChatCompletionsModel(model=MODEL, openai_client=target.openai())
        agent = agents.Agent(name="weather", instructions="Use the tool.", model=model,
                             tools=[agents.function_tool(get_weather)])  # fmt: skip
        if streamed:
            run = agents.Runner.run_streamed(agent, QUESTION)
            async for _ in run.stream_events():
                pass
            result = run
        else:
            result = await agents.Runner.run(agent, QUESTION)
    assert result.final_output == "It is sunny, 21C in Oslo."
    assert "sunny, 21C in Oslo" in tokenizer.decode(source.prompts[1])


# -- on the bundled model ---------------------------------------------------------------------


@pytest.fixture
async def engine(bundled_model):
    engine = Engine(TokenGenerator(bundled_model), store_path="memory")
    yield engine
    await engine.aclose()


@pytest.mark.integration
@pytest.mark.slow
async def test_every_client_runs_on_the_bundled_model(engine):
    """Each client's default call answers (greedy, short), and the answers agree where the
    requests are the same: the same conversation gives the same text whoever sends it."""
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    question = "What is the capital of France? Answer in one word."
    with ThreadedServer(engine.client()) as server:
        name = engine.model
        llm = langchain_model(server, name, temperature=0, max_tokens=12)
        lc = (await llm.ainvoke(question)).content
        lc_stream = "".join([c.content async for c in llm.astream(question)])
        lite = litellm_call(server, name, messages=[{"role": "user", "content": question}],
                            temperature=0, max_tokens=12, logprobs=True)  # fmt: skip
        sdk = await server.openai().chat.completions.create(
            model=engine.model, messages=[{"role": "user", "content": question}],
            temperature=0, max_tokens=12,
        )  # fmt: skip
        agent = pydantic_ai_agent(server.openai(), str, name)
        pai = await agent.run(question, model_settings={"temperature": 0, "max_tokens": 12})
        model = agents.OpenAIChatCompletionsModel(model=engine.model,
                                                  openai_client=server.openai())  # fmt: skip
        oa = await agents.Runner.run(
            agents.Agent(name="a", model=model,
                         model_settings=agents.ModelSettings(temperature=0, max_tokens=12)),
            question,
        )  # fmt: skip
    want = sdk.choices[0].message.content
    assert want
    assert lc == lc_stream == lite.choices[0].message.content == want
    assert lite.choices[0].logprobs["content"]
    assert isinstance(pai.output, str) and pai.output  # (pydantic-ai adds its tools' prompt)
    assert isinstance(oa.final_output, str) and oa.final_output
