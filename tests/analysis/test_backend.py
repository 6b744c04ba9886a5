"""What is scored, decided once for every backend (``ScoringBackend.prepare``), checked on the
in-kernel backend against the tokenizer itself (no model needed)."""

from __future__ import annotations

import pytest
from helpers.responses import EOS, MODEL

from nbresponses.analysis.local import LocalBackend
from nbresponses.families.registry import select_family
from nbresponses.service.scoring import DEFAULT_METHOD, METHODS
from nbresponses.tokens.scripted import ScriptedTokenSource


@pytest.fixture
def backend(tokenizer) -> LocalBackend:
    source = ScriptedTokenSource([[EOS]], eos_token_ids=(EOS,), context_length=8192)
    family = select_family("auto", source=source, tokenizer=tokenizer)
    return LocalBackend(source, family, model=MODEL)


async def test_plain_text_is_every_token_after_the_end_of_text_token(backend, tokenizer):
    job = await backend.prepare("The sea was calm.")
    assert job.prompt == [EOS]
    assert job.given == tokenizer.encode("The sea was calm.", add_special_tokens=False)


async def test_a_continuation_after_its_prompt_and_an_empty_prompt_is_the_start_token(
    backend, tokenizer
):
    job = await backend.prepare("Is the sea calm?", " Yes")
    assert job.prompt == tokenizer.encode("Is the sea calm?", add_special_tokens=False)
    assert job.given == tokenizer.encode(" Yes", add_special_tokens=False)
    empty = await backend.prepare("", " Yes")
    assert empty.prompt == [EOS] and empty.given == job.given


async def test_a_chat_scores_the_assistant_turn_after_the_templated_prompt(backend, tokenizer):
    history = [{"role": "user", "content": "Hi!"}]
    want_prompt = tokenizer.apply_chat_template(history, add_generation_prompt=True)
    turn = await backend.prepare([*history, {"role": "assistant", "content": "Hello."}])
    assert turn.prompt == list(want_prompt)
    assert turn.given == tokenizer.encode("Hello.", add_special_tokens=False)
    asked = await backend.prepare("Hi!", "Hello.", chat=True)  # the same, said another way
    assert asked == turn


async def test_what_cannot_be_scored_is_refused_saying_what_to_do(backend):
    with pytest.raises(ValueError, match="chat=True"):
        await backend.prepare([{"role": "user", "content": "hi"}], chat=False)
    with pytest.raises(ValueError, match="assistant turn"):
        await backend.prepare([{"role": "user", "content": "hi"}])
    with pytest.raises(ValueError, match="method"):
        await backend.score_text("x", method="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="method='decode'"):  # the scripted source: no prefill
        await backend.score_text("x")


def test_one_default_method() -> None:
    assert DEFAULT_METHOD == "prefill" and DEFAULT_METHOD in METHODS
