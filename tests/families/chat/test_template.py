"""Chat rendering: Hermes tools injected into SmolLM2's template, a native template's thinking
and tools, forced and required tool calls as prefills."""

from __future__ import annotations

from helpers.chat_templates import Templated

from nbresponses.families.chat.template import TemplateCapabilities, render, tool_schema


def test_render_injects_hermes_tools_for_smollm2(tokenizer):
    assert not TemplateCapabilities.of(tokenizer).tools
    tools = [tool_schema("get_weather", "Weather now.", {"type": "object", "properties": {}})]
    msgs = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
    ]  # fmt: skip
    p = render(tokenizer, msgs, tools=tools)
    assert "<tools>" in p.text and '"name": "get_weather"' in p.text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in p.text
    assert "<tool_response>\nsunny\n</tool_response>" in p.text
    assert p.text.endswith("<|im_start|>assistant\n") and p.prefill == ""
    assert tokenizer.decode(p.ids) == p.text
    assert "<tools>" not in render(tokenizer, msgs, tools=tools, tool_mode="none").text
    forced = render(tokenizer, msgs, tools=tools, forced_tool="get_weather")
    assert forced.text.endswith('<tool_call>\n{"name": "get_weather", "arguments": ')
    assert forced.prefill == '<tool_call>\n{"name": "get_weather", "arguments": '
    assert render(tokenizer, msgs, tools=tools, tool_mode="required").prefill == "<tool_call>\n"


THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function | tojson }}"
    "</tool_call>{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if tools %}TOOLS:{{ tools | tojson }}{% endif %}"
    "<|im_start|>assistant\n{% if enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}"
)


def test_native_template_thinking_and_tools(tokenizer):
    tok = Templated(tokenizer, THINKING_TEMPLATE)
    caps = TemplateCapabilities.of(tok)
    assert caps.tools and caps.enable_thinking and caps.effort
    msgs = [{"role": "user", "content": "hi"}]
    p = render(tok, msgs, tools=[tool_schema("f", None, None)])
    assert "TOOLS:" in p.text and p.prefill == "<think>\n"
    assert render(tok, msgs, reasoning_effort="none").prefill == ""
    forced = render(tok, msgs, tools=[tool_schema("f", None, None)], forced_tool="f")
    assert "</think>" in forced.text and forced.prefill.startswith("<tool_call>")
