"""A source's tokenizer, config and fp32 PyTorch model, each loaded at most once per prepare.

The fused recipes build their graph from the PyTorch weights and measure fidelity against the
same model (teacher-forced, as the fidelity report describes), so they need no Optimum export:
preparing the bundled model that way skips the export's ~20 s and ~3 GB peak. The files the
engine reads next to the model (tokenizer, chat template, config.json, generation_config.json)
are written here as the export writes them.

A Hugging Face folder of safetensors files is streamed (``streamed.py``): the model is a
skeleton without weights, each weight read when the graph builder or a layer asks for it, so
a prepare never holds the whole model (a 0.6B model is ~2 GB in fp32). GGUF files (the
bundled model) and other folders are loaded whole by transformers, as before; both give the
same graph and the same reference logits (``tests/models/test_streamed.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from nbresponses.models.export import fix_generation_config, load_tokenizer, quiet_export
from nbresponses.models.fused import load_source_model
from nbresponses.models.gguf_once import parsed_once
from nbresponses.models.heap import trim_heap
from nbresponses.models.layered import Text, forward_all
from nbresponses.models.sources import ModelSource
from nbresponses.models.streamed import open_streamed

# What fidelity is measured against for recipes built from here: the fp32 PyTorch model
# (layer by layer when streamed: the same logits, bit for bit).
REFERENCE = "PyTorch fp32"


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
        """The fp32 ``…ForCausalLM`` in eval mode, its eos / pad ids the tokenizer's: loaded
        whole, or a skeleton whose weights are ``tensors`` (a folder of safetensors files)."""
        opened = None
        if self.source.gguf_file is None:
            with quiet_export():
                opened = open_streamed(self.source.path, self.config)
        if opened is None:
            model, self.tensors = load_source_model(self.source), None
        else:
            model, self.tensors = opened
            model.generation_config = _generation_config(self.source.path, model)
        tokenizer = self.tokenizer
        for config in (model.config, model.generation_config):
            if config is not None:
                config.eos_token_id = tokenizer.eos_token_id
                config.pad_token_id = tokenizer.pad_token_id
        return model

    # The weights of a streamed ``model`` by state-dict name (None: the model holds them).
    tensors: Mapping[str, Any] | None = None

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
            self.tensors = None
            trim_heap()

    def write_files(self, folder: Path) -> None:
        """What the engine reads beside the model file, as the Optimum export leaves it:
        the tokenizer with its chat template, config.json and generation_config.json."""
        model, tokenizer = self.model, self.tokenizer
        tokenizer.save_pretrained(str(folder))
        model.config.save_pretrained(str(folder))
        if model.generation_config is not None:
            model.generation_config.save_pretrained(str(folder))
        fix_generation_config(folder, tokenizer)

    def reference_logits(self, texts: Sequence[Text]) -> Iterator[np.ndarray]:
        """fp32 logits [kept positions, vocab] of each (ids, positions to keep) in order, from
        one forward pass over the ids (teacher forcing). The LM head (a fifth of a small model)
        runs on the kept positions only: fidelity scores the answers' tokens, not the prompts'."""
        import torch

        kept = [(ids, torch.as_tensor(np.asarray(keep, np.int64))) for ids, keep in texts]
        return forward_all(self.model, kept, self.tensors)


def _generation_config(folder: Path, model: Any) -> Any:
    """What ``from_pretrained`` gives a model: the folder's generation config, else one made
    from the model's config."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(str(folder))
    except OSError:
        return model.generation_config
