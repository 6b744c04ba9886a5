"""A source's tokenizer, config and fp32 PyTorch model, each loaded at most once per prepare.

The fused recipes build their graph from the PyTorch weights and measure fidelity against the
same model (teacher-forced, as the fidelity report describes), so they need no Optimum export:
preparing the bundled model that way skips the export's ~20 s and ~3 GB peak. The files the
engine reads next to the model (tokenizer, chat template, config.json, generation_config.json)
are written here as the export writes them.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from nbresponses.models.cpu import physical_cores
from nbresponses.models.export import fix_generation_config, load_tokenizer, quiet_export
from nbresponses.models.fused import load_source_model
from nbresponses.models.gguf_once import parsed_once
from nbresponses.models.sources import ModelSource

# What fidelity is measured against for recipes built from here: the fp32 graph against
# PyTorch, quantized graphs against the fp32 graph (prepare._fidelity_from_source says why).
REFERENCE = "PyTorch fp32"
FUSED_REFERENCE = "fused fp32 (ONNX Runtime)"


def _trim_heap() -> None:
    """Return freed heap memory to the system. glibc keeps it otherwise: it serves blocks up to
    32 MB from its heap once a larger block was freed (the GGUF loader's dequantized arrays),
    and the model's layers are such blocks; measured: dropping the bundled model gave back
    110 MB of its 540 MB without this."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class SourceModel:
    """Lazily loaded parts of one source; ``release()`` frees the weights."""

    def __init__(self, source: ModelSource) -> None:
        self.source = source

    @cached_property
    def tokenizer(self) -> Any:
        """The (repaired) transformers tokenizer."""
        return load_tokenizer(self.source)

    @cached_property
    def config(self) -> Any:
        """The model's transformers config (read without loading any weights)."""
        from transformers import AutoConfig

        source = self.source
        with quiet_export():
            if source.gguf_file is not None:
                return AutoConfig.from_pretrained(
                    str(source.path.parent), gguf_file=source.path.name
                )
            return AutoConfig.from_pretrained(str(source.path))

    @cached_property
    def model(self) -> Any:
        """The fp32 ``…ForCausalLM`` in eval mode, its eos / pad ids the tokenizer's."""
        model = load_source_model(self.source)
        tokenizer = self.tokenizer
        for config in (model.config, model.generation_config):
            if config is not None:
                config.eos_token_id = tokenizer.eos_token_id
                config.pad_token_id = tokenizer.pad_token_id
        return model

    @property
    def loaded(self) -> bool:
        return "model" in self.__dict__

    def load(self, check: Callable[[SourceModel], None] | None = None) -> None:
        """Config, tokenizer and weights, a GGUF file's metadata parsed once for all three
        (``gguf_once``; its memory is freed when they are loaded). ``check`` sees the config
        before any weight is read (and may raise UnsupportedArchitecture)."""
        with parsed_once():
            if check is not None:
                check(self)
            self.model  # noqa: B018 (the tokenizer first: the model takes its eos / pad ids)

    def release(self) -> None:
        """Drop the weights (before another step loads the model its own way) and give their
        memory back to the system."""
        if self.__dict__.pop("model", None) is not None:
            gc.collect()
            _trim_heap()

    def write_files(self, folder: Path) -> None:
        """What the engine reads beside the model file, as the Optimum export leaves it:
        the tokenizer with its chat template, config.json and generation_config.json."""
        model, tokenizer = self.model, self.tokenizer
        tokenizer.save_pretrained(str(folder))
        model.config.save_pretrained(str(folder))
        if model.generation_config is not None:
            model.generation_config.save_pretrained(str(folder))
        fix_generation_config(folder, tokenizer)

    def logits(self, ids: list[int], positions: np.ndarray) -> np.ndarray:
        """fp32 logits [len(positions), vocab] at ``positions`` of one forward pass over
        ``ids`` (teacher forcing). The LM head (a fifth of the model) runs on those positions
        only: fidelity scores the answers' tokens, not the prompts'."""
        import torch

        keep = torch.as_tensor(np.asarray(positions, np.int64))
        # One thread less than the cores: PyTorch's OpenMP threads wait for each other at every
        # op, and one descheduled thread stalls them all (on 2 busy cores, measured: 300
        # tokens in 1.5-2 s with 1 thread, 10-38 s with 2).
        threads = torch.get_num_threads()
        torch.set_num_threads(max(1, min(threads, physical_cores() - 1)))
        try:
            with torch.no_grad():  # transformers computes the LM head at ``logits_to_keep`` only
                out = self.model(
                    input_ids=torch.tensor([ids], dtype=torch.long),
                    use_cache=False,
                    logits_to_keep=keep,
                )
        finally:
            torch.set_num_threads(threads)
        return out.logits[0].float().numpy()
