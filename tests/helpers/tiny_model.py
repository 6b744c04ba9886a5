"""A tiny random-weight Llama model for fast tests: built in seconds, exported in about one.

It reuses the bundled SmolLM2 tokenizer (so chat templates and special tokens are real) with a
64-wide, 2-layer network. Its answers are noise; its mechanics are those of the real model.
"""

from __future__ import annotations

from pathlib import Path


def build_tiny_llama(
    folder: Path, tokenizer_folder: Path, *, seed: int = 0, layers: int = 2
) -> Path:
    """Write a Hugging Face folder (config, weights, tokenizer) for a tiny Llama to ``folder``."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_folder))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # larger weights than the default init: peakier, more varied logits
        for param in model.parameters():
            param.mul_(8.0)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder
