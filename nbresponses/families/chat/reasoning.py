"""``reasoning.effort`` for a chat template, and where a rendered prompt leaves the reasoning.

Templates switch reasoning in different ways (``capabilities.TemplateCapabilities``); the effort
becomes what the template understands, and a request it cannot honour is a 400 naming
``reasoning.effort`` (never a silently ignored parameter):

- ``enable_thinking`` switch (Qwen3, SmolLM3): none / minimal -> ``enable_thinking=False``,
  low / medium / high / xhigh -> ``enable_thinking=True``;
- ``reasoning_effort`` variable: the value itself (a template that refuses it: 400);
- always reasons: knows the ``<think>`` tags but has no switch (DeepSeek-R1 distills, QwQ):
  none / minimal -> 400, any other effort is honoured (it reasons anyway);
- no reasoning at all (SmolLM2): any effort -> 400, as OpenAI answers for a model without
  reasoning.

A template with both variables gets both. Without ``reasoning.effort`` the template's default
holds. A template may override its own switch: SmolLM3's ``/think`` and ``/no_think`` flags in
the system message win over ``enable_thinking``; when that leaves thinking the other way than
the effort asks, the request is a 400 too (``contradiction``).
"""

from __future__ import annotations

from typing import Any, Literal

import openai

from nbresponses.families.chat.capabilities import TemplateCapabilities
from nbresponses.families.chat.parser import THINK_CLOSE, THINK_OPEN
from nbresponses.protocol.errors import unsupported

OFF = ("none", "minimal")  # efforts that mean "do not think"

# Where the rendered prompt leaves the model:
#   "open": inside an opened <think> (R1 distills' newer templates, QwQ): it reasons first;
#   "closed": after an empty <think></think> (thinking switched off): it answers;
#   "implicit": a template whose model starts inside its reasoning without writing <think>
#       (older R1 distill templates): reasoning until </think>, a leading <think> is optional;
#   "free": the model opens <think> itself or not (Qwen3 and SmolLM3 thinking on, and the rest).
ThinkStart = Literal["open", "closed", "implicit", "free"]


def effort_kwargs(caps: TemplateCapabilities, effort: str | None) -> dict[str, Any]:
    """The template variables for ``effort`` (a 400 when the template cannot honour it)."""
    if effort is None:
        return {}
    if not caps.reasons:
        raise unsupported("reasoning.effort", "this model's chat template has no reasoning.")
    if not caps.effort:
        if effort in OFF:
            raise unsupported(
                "reasoning.effort",
                f"{effort!r} asks for no reasoning, and this model's chat template always "
                "reasons (it has no switch to turn reasoning off); use low, medium or high, "
                "or leave reasoning.effort out.",
            )
        return {}  # the model reasons anyway: any other effort is honoured as "on"
    kwargs: dict[str, Any] = {}
    if caps.reasoning_effort:
        kwargs["reasoning_effort"] = effort
    if caps.enable_thinking:
        kwargs["enable_thinking"] = effort not in OFF
    return kwargs


def think_start(text: str, caps: TemplateCapabilities) -> ThinkStart:
    """Where ``text`` (a rendered prompt ready for the assistant's turn) leaves the reasoning."""
    if text.rstrip().endswith(THINK_CLOSE):
        return "closed"
    at = text.rfind(THINK_OPEN)
    if at >= 0 and not text[at + len(THINK_OPEN) :].strip():
        return "open"
    return "implicit" if caps.implicit_think else "free"


def contradiction(effort: str, start: ThinkStart) -> str | None:
    """Why a prompt that starts so may not do what ``effort`` asks (None: it does).

    Only a suspicion: a template whose "off" leaves the model free is fine if the switch
    changed the prompt at all; ``template.render`` checks that before it refuses.
    """
    wants = effort not in OFF
    if wants and start == "closed":
        return "the conversation turns thinking off"
    if not wants and start in ("open", "free", "implicit"):
        return "the conversation keeps thinking on"
    return None


def overridden(effort: str, reason: str) -> openai.BadRequestError:
    """The 400 for a template that overrode its own switch (SmolLM3's system flags)."""
    return unsupported(
        "reasoning.effort",
        f"{effort!r} cannot be honoured: {reason} whatever enable_thinking says (a /think or "
        "/no_think flag in the instructions or a system message?).",
    )
