"""The bundled tokenizer as the grammar engine sees it (built once: ~1.5 s)."""

from __future__ import annotations

import pytest

from nbresponses.families.chat.family import ChatFamily


@pytest.fixture(scope="session")
def grammar_tokenizer(tokenizer):
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return ChatFamily(tokenizer, eos_token_ids=[eos]).grammar_tokenizer()
