"""Turn a source into an fp32 ONNX model with KV cache, using Optimum's exporter.

GGUF sources are first loaded by transformers (dequantized to fp32) and saved as a Hugging Face
folder, because Optimum exports from PyTorch models.
"""

from __future__ import annotations

import contextlib
import json
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nbresponses.models.errors import ModelSourceError
from nbresponses.models.sources import ModelSource

EXPORT_TASK = "text-generation-with-past"


@contextlib.contextmanager
def quiet_export() -> Iterator[None]:
    """Silence the expected flood of TracerWarnings and exporter chatter (see
    docs/concepts/measurements.md).

    Also undoes ``logging.basicConfig(level=INFO)``, which some onnxruntime.quantization
    modules call at import time: it would make every library's INFO records print in the
    user's notebook from then on.
    """
    names = ("", "transformers", "optimum", "torch.onnx", "onnxruntime")  # "" = root logger
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    root_handlers = list(logging.getLogger().handlers)
    try:
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.getLogger().handlers[:] = root_handlers
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def fix_chatml_tokenizer(tokenizer: Any) -> bool:
    """Repair tokenizers rebuilt from GGUF files of ChatML models (SmolLM2 among them).

    They come back with eos = ``<|im_start|>`` and an automatic BOS, so every rendered chat
    prompt starts with ``<|im_start|>`` twice and generation never stops at the turn's end.
    Returns True when something was changed.
    """
    template = tokenizer.chat_template or ""
    if "<|im_end|>" not in template or tokenizer.eos_token == "<|im_end|>":
        return False
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.pad_token = "<|im_end|>"
    if hasattr(tokenizer, "add_bos_token"):
        tokenizer.add_bos_token = False
    return True


def load_tokenizer(source: ModelSource) -> Any:
    """The source's tokenizer, repaired where GGUF conversion broke it."""
    from transformers import AutoTokenizer

    try:
        with quiet_export():
            if source.gguf_file is not None:
                tokenizer = AutoTokenizer.from_pretrained(
                    str(source.path.parent), gguf_file=source.path.name
                )
                fix_chatml_tokenizer(tokenizer)
            else:
                tokenizer = AutoTokenizer.from_pretrained(str(source.path))
    except Exception as exc:  # corrupt files, non-text models, missing tokenizer files
        raise ModelSourceError(f"No usable tokenizer in {source.path}: {exc}") from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def materialize_hf_folder(source: ModelSource, folder: Path) -> Path:
    """Write a GGUF source as a Hugging Face folder Optimum can export; other sources as is."""
    if source.gguf_file is None:
        return source.path
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with quiet_export():
            model = AutoModelForCausalLM.from_pretrained(
                str(source.path.parent), gguf_file=source.path.name, dtype=torch.float32
            )
    except Exception as exc:
        raise ModelSourceError(
            f"{source.path} could not be loaded as a language model GGUF file: {exc}"
        ) from exc
    tokenizer = load_tokenizer(source)
    model.config.eos_token_id = tokenizer.eos_token_id
    model.config.pad_token_id = tokenizer.pad_token_id
    if model.generation_config is not None:
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


def check_causal_lm(folder: Path) -> dict[str, Any]:
    """Read config.json and refuse models that are not decoder-only language models."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelSourceError(f"{folder} has no readable config.json: {exc}") from exc
    architectures = config.get("architectures") or []
    if not any(a.endswith("ForCausalLM") for a in architectures):
        raise ModelSourceError(
            f"{folder} is not a causal language model (architectures: {architectures or 'none'}); "
            "nbresponses runs text-generation models (…ForCausalLM)."
        )
    return config


def export_onnx(hf_folder: Path, output: Path, tokenizer: Any) -> None:
    """Export ``hf_folder`` to ``output/model.onnx`` with KV cache inputs and outputs."""
    from optimum.exporters.onnx import main_export

    check_causal_lm(hf_folder)
    try:
        with quiet_export():
            main_export(
                str(hf_folder),
                output=str(output),
                task=EXPORT_TASK,
                do_validation=False,
                local_files_only=True,
            )
    except Exception as exc:
        raise ModelSourceError(f"Optimum could not export {hf_folder} to ONNX: {exc}") from exc
    tokenizer.save_pretrained(str(output))
    fix_generation_config(output, tokenizer)


def fix_generation_config(output: Path, tokenizer: Any) -> None:
    """Make the exported configs agree with the (repaired) tokenizer's eos/pad ids."""
    for name in ("config.json", "generation_config.json"):
        path = output / name
        if not path.is_file():
            continue
        data = json.loads(path.read_text())
        data["eos_token_id"] = tokenizer.eos_token_id
        data["pad_token_id"] = tokenizer.pad_token_id
        path.write_text(json.dumps(data, indent=2))
