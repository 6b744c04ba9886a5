"""The prepared folder's tokenizer without transformers gives what transformers gives, exactly."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paths import ROOT
from transformers import AutoTokenizer

from nbresponses.models.fidelity_set import FIDELITY_SET
from nbresponses.models.tokenizer import StoredTokenizer

TEXTS = [
    "",
    " ",
    "Hello, world! It's a test: don't stop , ok ?",
    "  leading and trailing spaces  \n\n\ttabs\r\n",
    "naïve café, Straße, 東京, emoji 🎉🧪, Ελληνικά, العربية",
    "<|im_start|>user\nspecial tokens inside text<|im_end|>\n<|endoftext|>",
    "def f(x):\n    return x ** 2  # code\n",
    '{"json": [1, 2.5, null], "nested": {"a": "b"}}',
    *(m["content"] for s in FIDELITY_SET for m in s.messages),
]

TOOL_TEMPLATE = (
    "{%- if tools %}{{ '<|im_start|>system\\n' }}{% for t in tools %}{{ t | tojson }}\n"
    "{% endfor %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{%- for m in messages %}{% if m.role == 'boom' %}{{ raise_exception('no boom') }}{% endif %}"
    "{% if loop.index > 20 %}{% break %}{% endif %}"
    "{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and not enable_thinking %}{{ '<think></think>' }}{% endif %}"
    "{% endif %}{{ eos_token if false else '' }}{{ bos_token | length }}"
)


@pytest.fixture(scope="module")
def pair(tokenizer_dir: Path):
    return StoredTokenizer.load(tokenizer_dir), AutoTokenizer.from_pretrained(str(tokenizer_dir))


def test_ids_texts_and_tokens_match_transformers(pair) -> None:
    ours, theirs = pair
    for text in TEXTS:
        for special in (True, False):
            ids = theirs.encode(text, add_special_tokens=special)
            assert ours.encode(text, add_special_tokens=special) == ids, text
        ids = theirs.encode(text)
        for skip in (True, False):
            for clean in (None, True, False):
                options = {"skip_special_tokens": skip, "clean_up_tokenization_spaces": clean}
                assert ours.decode(ids, **options) == theirs.decode(ids, **options), text
    vocab = theirs.get_vocab()
    assert ours.get_vocab() == vocab
    ids = list(range(len(vocab)))
    assert ours.convert_ids_to_tokens(ids) == theirs.convert_ids_to_tokens(ids)
    assert ours.convert_ids_to_tokens(ids, skip_special_tokens=True) == (
        theirs.convert_ids_to_tokens(ids, skip_special_tokens=True)
    )
    assert [ours.convert_ids_to_tokens(i) for i in ids[:300]] == (
        [theirs.convert_ids_to_tokens(i) for i in ids[:300]]
    )
    assert [ours.decode(i) for i in ids[:300]] == [theirs.decode(i) for i in ids[:300]]


def test_special_tokens_match_transformers(pair) -> None:
    ours, theirs = pair
    for name in ("bos", "eos", "pad", "unk"):
        assert getattr(ours, f"{name}_token") == getattr(theirs, f"{name}_token")
        assert getattr(ours, f"{name}_token_id") == getattr(theirs, f"{name}_token_id")
    assert ours.eos_token == "<|im_end|>"  # the repaired GGUF tokenizer, as stored
    assert ours.special_tokens_map == theirs.special_tokens_map
    assert ours.all_special_ids == theirs.all_special_ids
    assert ours.vocab_size == theirs.vocab_size and len(ours) == len(theirs)
    assert {i: (t.content, t.special) for i, t in ours.added_tokens_decoder.items()} == {
        i: (t.content, t.special) for i, t in theirs.added_tokens_decoder.items()
    }
    assert ours.chat_template == theirs.chat_template


def _conversations() -> list[list[dict[str, str]]]:
    chats = [[dict(m) for m in s.messages] for s in FIDELITY_SET]
    chats.append([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    return chats


def test_chat_template_renders_as_transformers(pair) -> None:
    ours, theirs = pair
    for chat in _conversations():
        for prompt in (True, False):
            for tokenize in (True, False):
                options = {"add_generation_prompt": prompt, "tokenize": tokenize}
                got = ours.apply_chat_template(chat, **options)
                assert got == theirs.apply_chat_template(chat, **options)


def test_templates_with_tools_filters_and_globals(tokenizer_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "tok"
    shutil.copytree(tokenizer_dir, folder)
    (folder / "chat_template.jinja").write_text(TOOL_TEMPLATE)
    ours, theirs = StoredTokenizer.load(folder), AutoTokenizer.from_pretrained(str(folder))
    assert ours is not None
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"é": [1, "<b>"]}}}]
    chat = [{"role": "user", "content": "Use f."}]
    for kwargs in ({}, {"tools": tools}, {"enable_thinking": False}, {"eos_token": "X"}):
        options = {"add_generation_prompt": True, "tokenize": False, **kwargs}
        assert ours.apply_chat_template(chat, **options) == (
            theirs.apply_chat_template(chat, **options)
        )
    many = chat * 30
    assert ours.apply_chat_template(many, tokenize=False) == (
        theirs.apply_chat_template(many, tokenize=False)
    )
    from jinja2.exceptions import TemplateError

    with pytest.raises(TemplateError, match="no boom"):
        ours.apply_chat_template([{"role": "boom", "content": ""}])


def test_other_uses_go_to_transformers(pair) -> None:
    ours, theirs = pair
    assert ours("Hello there")["input_ids"] == theirs("Hello there")["input_ids"]
    assert ours.tokenize("Hello there") == theirs.tokenize("Hello there")
    chat = [{"role": "user", "content": "Hi"}]
    got = ours.apply_chat_template(chat, return_dict=True, add_generation_prompt=True)
    assert got["input_ids"] == theirs.apply_chat_template(chat, add_generation_prompt=True)


def test_no_tokenizer_json_means_transformers(tmp_path: Path) -> None:
    assert StoredTokenizer.load(tmp_path) is None


def test_loading_a_prepared_model_imports_no_transformers(tiny_model) -> None:
    """The engine's load path (prepared folder -> tokenizer -> session) stays off transformers
    and torch: importing them is most of what a load used to cost."""
    code = (
        "import sys\n"
        "from nbresponses.models.prepared import PreparedModel\n"
        "from nbresponses.runtime.generator import TokenGenerator\n"
        f"g = TokenGenerator(PreparedModel.open({str(tiny_model.path)!r}))\n"
        "assert g.tokenizer.encode('Hello') and g.eos_token_ids\n"
        "print(sorted(m for m in ('transformers', 'torch') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", out.stderr
