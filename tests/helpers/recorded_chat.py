"""Load the recorded Chat Completions and legacy Completions traffic in
``tests/fixtures/recorded-chat`` (see its README: sources, licences, what each file holds).

Each file is one HTTP answer; ``load(name)`` gives it as JSON data, whatever the container:

- a stream: the list of its chunk dicts (SSE ``data:`` payloads; comments and ``[DONE]``
  dropped), in arrival order;
- a non-streamed body: the dict (a ChatCompletion, a Completion, or an error body).

Containers: raw SSE bytes (``.bin``), one payload per line (``.chunks.txt``), a JSON body
(``.json``), the Azure Core recorder's session JSON (``openai-dotnet__``: ``ResponseBody`` a
list of ``"data: …"`` strings), and vcrpy YAML cassettes (``body.string`` with SSE or JSON,
or ``parsed_body``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from helpers.paths import ROOT

__all__ = ["BODIES", "FIXTURES", "STREAMS", "load", "parse_sse"]

FIXTURES = ROOT / "tests" / "fixtures" / "recorded-chat"

# name prefix -> what the file is (the README's table)
STREAMS = {
    "dotnet_logprobs": "openai-dotnet__TokenLogProbabilitiesStreaming(True).json",
    "content_logprobs": (
        "openai-python__83b060bae42eb41c4f1edbb7c1542b954b37d9dfd1910b964ddebc9677e6ae85.bin"
    ),
    "refusal_logprobs": (
        "openai-python__569c877e69429d4cbc1577d2cd6dd33878095c68badc6b6654a69769b391a1c1.bin"
    ),
    "one_tool": (
        "openai-python__2018feb66ae13fcf5333d61b95849decc68d3f63bd38172889367e1afb1e04f7.bin"
    ),
    "parallel_tools": (
        "openai-python__f82268f2fefd5cfbc7eeb59c297688be2f6ca0849a6e4f17851b517310841d9b.bin"
    ),
    "n3": "openai-python__a491adda08c3d4fde95f5b2ee3f60f7f745f1a56d82e62f58031cc2add502380.bin",
    "deepseek": "dd-trace-py__deepseek_streamed_reasoning_content.yaml",
    "openrouter": "pydantic-ai__test_openrouter_streaming_reasoning.yaml",
    "openrouter_error": "pydantic-ai__test_openrouter_stream_error.yaml",
    "vllm": "pydantic-ai__test_crusoe_model_streaming.yaml",
    "legacy_stream": "vercel-ai__openai-completion-text.chunks.txt",
}
BODIES = {
    "n2": "opentelemetry-python-contrib__test_chat_completion_multiple_choices.yaml",
    "error_404": "opentelemetry-python-contrib__test_chat_completion_404.yaml",
    "vllm_reasoning": "pydantic-ai__test_crusoe_model_simple.yaml",
    "legacy": "vercel-ai__openai-completion-text.json",
}


class _Loader(yaml.SafeLoader):
    """YAML 1.2 floats without a dot (``-2e-6``) read as floats, not strings."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def parse_sse(text: str) -> list[dict[str, Any]]:
    """Payloads of SSE text: ``data:`` lines joined per event; comments and ``[DONE]`` dropped."""
    payloads = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        lines = [
            line[5:].removeprefix(" ") for line in block.split("\n") if line.startswith("data:")
        ]
        data = "\n".join(lines).strip()
        if data and data != "[DONE]":
            payloads.append(json.loads(data))
    return payloads


def _body(text: str) -> Any:
    """An HTTP body's text: SSE (a stream's chunks) or JSON."""
    return parse_sse(text) if re.search(r"^data:", text, re.MULTILINE) else json.loads(text)


def _path(name: str) -> Path:
    return FIXTURES / STREAMS.get(name, BODIES.get(name, name))


def load(name: str) -> Any:
    """The recorded answer ``name`` (a key of STREAMS or BODIES, or a file name)."""
    path = _path(name)
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".bin":
        return parse_sse(text)
    if path.name.endswith(".chunks.txt"):
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    if path.suffix == ".yaml":
        response = yaml.load(text, Loader=_Loader)["interactions"][0]["response"]
        if "parsed_body" in response:
            return response["parsed_body"]
        return _body(response["body"]["string"])
    data = json.loads(text)
    if isinstance(data, dict) and "Entries" in data:  # the Azure Core test recorder
        body = data["Entries"][0]["ResponseBody"]
        return parse_sse("".join(body)) if isinstance(body, list) else body
    return data
