"""Load the gpt-oss harmony encoding offline (memoised: one encoding per process and folder)."""

from __future__ import annotations

import functools
import os
from pathlib import Path

from openai_harmony import HarmonyEncoding, HarmonyEncodingName, load_harmony_encoding

from nbresponses.families.harmony.vocab import (
    ENV_VAR,
    VOCAB_NAME,
    HarmonyVocabularyError,
    build_vocab_file,
    missing_vocab_message,
)
from nbresponses.models.cache import cache_root

CACHE_SUBDIR = "harmony"


def vocab_folder(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Our cached vocabulary folder (built from quicktok on first use)."""
    return build_vocab_file(cache_root(cache_dir) / CACHE_SUBDIR).parent


def prepare_vocab(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Make harmony find its vocabulary offline; returns the folder it will read.

    A ``TIKTOKEN_ENCODINGS_BASE`` the user set is respected as is; otherwise we build our copy and
    point the variable at it.
    """
    user = os.environ.get(ENV_VAR)
    if user:
        return Path(user)
    folder = vocab_folder(cache_dir)
    os.environ[ENV_VAR] = str(folder)
    return folder


@functools.lru_cache(maxsize=4)
def _load(folder: str) -> HarmonyEncoding:
    try:
        return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    except Exception as exc:  # HarmonyError: usually the download that cannot happen offline
        has_file = (Path(folder) / VOCAB_NAME).is_file()
        where = f"{ENV_VAR}={folder}" + ("" if has_file else f" (no {VOCAB_NAME} there)")
        raise HarmonyVocabularyError(f"{exc}\n\nWith {where}. {missing_vocab_message()}") from exc


def harmony_encoding(cache_dir: str | os.PathLike[str] | None = None) -> HarmonyEncoding:
    """The gpt-oss harmony encoding, loaded without internet (see ``prepare_vocab``)."""
    return _load(str(prepare_vocab(cache_dir)))
