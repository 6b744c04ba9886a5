"""Chat templates written for the tests that behave like the real ones of reasoning models.

Each keeps what matters to rendering and parsing: the generation prompt (whether it opens or
closes ``<think>``), the switches (``enable_thinking``, SmolLM3's ``/think`` / ``/no_think``
system flags, a ``reasoning_effort`` variable), and what happens to earlier turns' reasoning.
They run on the bundled SmolLM2 tokenizer (``Templated``), so no hub is needed.

- ``QWEN3``: Qwen3's template (tools in the system turn; reasoning_content kept only for the
  assistant turns after the last user query; ``enable_thinking=False`` closes an empty block).
- ``SMOLLM3``: SmolLM3's (``enable_thinking`` default true, overridden by a ``/think`` or
  ``/no_think`` flag in the system message, which is removed from the text; earlier reasoning
  dropped; past tool calls not rendered; the real one also prints today's date).
- ``R1_OPEN``: DeepSeek-R1-Distill's current template (the prompt ends with ``<think>\\n``;
  earlier reasoning stripped up to ``</think>``).
- ``R1_BARE``: the first R1-Distill template (no ``<think>`` in the prompt: the model starts
  inside its reasoning and writes only ``</think>``).
- ``EFFORT``: a template with a ``reasoning_effort`` variable that refuses values it lacks.
- The bundled SmolLM2 template has no reasoning at all.
"""

from __future__ import annotations

QWEN3 = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n\
You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and \
arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \
\\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and \
not(message.content.startswith('<tool_response>') and \
message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = \
content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + \
reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""

SMOLLM3 = """\
{%- if enable_thinking is not defined -%}{%- set enable_thinking = true -%}{%- endif -%}
{%- if enable_thinking -%}{%- set reasoning_mode = "/think" -%}\
{%- else -%}{%- set reasoning_mode = "/no_think" -%}{%- endif -%}
{%- set custom_instructions = "" -%}
{%- if messages[0].role == "system" -%}
  {%- set system_message = messages[0].content -%}
  {%- if "/no_think" in system_message -%}{%- set reasoning_mode = "/no_think" -%}
  {%- elif "/think" in system_message -%}{%- set reasoning_mode = "/think" -%}{%- endif -%}
  {%- set custom_instructions = \
system_message.replace("/no_think", "").replace("/think", "").rstrip() -%}
{%- endif -%}
{{- "<|im_start|>system\\n" -}}
{{- "## Metadata\\n\\nKnowledge Cutoff Date: June 2025\\n" -}}
{{- "Reasoning Mode: " + reasoning_mode + "\\n\\n" -}}
{{- "## Custom Instructions\\n\\n" -}}
{%- if custom_instructions -%}{{- custom_instructions + "\\n\\n" -}}
{%- elif reasoning_mode == "/think" -%}\
{{- "You are a helpful AI assistant named SmolLM. Think before you answer.\\n\\n" -}}
{%- else -%}{{- "You are a helpful AI assistant named SmolLM.\\n\\n" -}}{%- endif -%}
{%- if tools -%}
  {{- "### Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\
You are provided with function signatures within <tools></tools> XML tags:\\n\\n<tools>\\n" -}}
  {%- for tool in tools -%}{{- tool | tojson -}}{{- "\\n" -}}{%- endfor -%}
  {{- "</tools>\\n\\nFor each function call, return a json object with function name and \
arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \
\\"arguments\\": <args-json-object>}\\n</tool_call>" -}}
{%- endif -%}
{{- "<|im_end|>\\n" -}}
{%- for message in messages -%}
  {%- set content = message.content if message.content is string else "" -%}
  {%- if message.role == "user" -%}
    {{ "<|im_start|>" + message.role + "\\n" + content + "<|im_end|>\\n" }}
  {%- elif message.role == "assistant" -%}
    {%- if reasoning_mode == "/think" -%}
      {{ "<|im_start|>assistant\\n" + content.lstrip("\\n") + "<|im_end|>\\n" }}
    {%- else -%}
      {{ "<|im_start|>assistant\\n" + "<think>\\n\\n</think>\\n" + content.lstrip("\\n") + \
"<|im_end|>\\n" }}
    {%- endif -%}
  {%- elif message.role == "tool" -%}
    {{ "<|im_start|>" + "user\\n" + content + "<|im_end|>\\n" }}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {%- if reasoning_mode == "/think" -%}{{ "<|im_start|>assistant\\n" }}
  {%- else -%}{{ "<|im_start|>assistant\\n" + "<think>\\n\\n</think>\\n" }}{%- endif -%}
{%- endif -%}
"""

_R1 = """\
{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}\
{% set ns = namespace(system_prompt='') %}\
{%- for message in messages %}{%- if message['role'] == 'system' %}\
{% set ns.system_prompt = message['content'] %}{%- endif %}{%- endfor %}\
{{ ns.system_prompt }}\
{%- for message in messages %}\
{%- if message['role'] == 'user' %}{{ '<|User|>' + message['content'] }}{%- endif %}\
{%- if message['role'] == 'assistant' %}{% set content = message['content'] %}\
{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}\
{{ '<|Assistant|>' + content + '<|im_end|>' }}{%- endif %}\
{%- endfor -%}\
"""
R1_OPEN = _R1 + "{% if add_generation_prompt %}{{ '<|Assistant|><think>\\n' }}{% endif %}"
R1_BARE = _R1 + "{% if add_generation_prompt %}{{ '<|Assistant|>' }}{% endif %}"

EFFORT = """\
{%- for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor -%}
{%- if reasoning_effort is defined and reasoning_effort not in ['low', 'medium', 'high'] -%}
{{ raise_exception('reasoning_effort must be low, medium or high') }}
{%- endif -%}
<|im_start|>assistant
Reasoning: {{ reasoning_effort | default('medium') }}
<think>
"""


class Templated:
    """A tokenizer with another chat template (everything else is the real tokenizer's)."""

    def __init__(self, tokenizer, template: str) -> None:
        self._tok = tokenizer
        self.chat_template = template

    def apply_chat_template(self, *args, **kwargs):
        return self._tok.apply_chat_template(*args, chat_template=self.chat_template, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tok, name)
