"""What a chat template understands, read from its source text.

Templates are Jinja programs that ignore what they do not read, so the only reliable way to
know whether passing ``tools`` or ``enable_thinking`` does anything is to look for the names
in the source. Rendering adapts to what is found (``template.render``, ``reasoning``).
"""

from __future__ import annotations

from dataclasses import dataclass

from nbresponses.families.chat.parser import THINK_CLOSE, THINK_OPEN
from nbresponses.tokens.contract import Tokenizer


@dataclass(frozen=True)
class TemplateCapabilities:
    """What a chat template understands.

    ``think_open`` / ``think_close``: the template writes or reads ``<think>`` / ``</think>``
    (in earlier turns or in the generation prompt): the model it belongs to reasons.
    """

    tools: bool
    reasoning_content: bool
    enable_thinking: bool
    reasoning_effort: bool
    tool_calls: bool = True
    think_open: bool = False
    think_close: bool = False

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> TemplateCapabilities:
        return cls.of_source(tokenizer.chat_template or "")

    @classmethod
    def of_source(cls, source: str | dict[str, str]) -> TemplateCapabilities:
        if isinstance(source, dict):
            source = "\n".join(str(v) for v in source.values())
        return cls(
            tools="tools" in source,
            reasoning_content="reasoning_content" in source,
            enable_thinking="enable_thinking" in source,
            reasoning_effort="reasoning_effort" in source,
            tool_calls="tool_calls" in source,
            think_open=THINK_OPEN in source,
            think_close=THINK_CLOSE in source,
        )

    @property
    def reasons(self) -> bool:
        """The template belongs to a model that reasons (has tags or a reasoning switch)."""
        return self.think_open or self.think_close or self.effort

    @property
    def effort(self) -> bool:
        """Whether the template has a switch ``reasoning.effort`` can be expressed with."""
        return self.enable_thinking or self.reasoning_effort

    @property
    def implicit_think(self) -> bool:
        """The model starts inside its reasoning with no opening tag (DeepSeek-R1 distills).

        Such a template knows ``</think>`` (it strips earlier reasoning up to it) but never
        writes or reads ``<think>``, and has no switch; a template that writes ``<think>``
        (Qwen3's, in earlier turns) belongs to a model that writes it too.
        """
        return self.think_close and not self.think_open and not self.effort
