"""lm-evaluation-harness, offline, on a small task written here: its ``local-completions``
model pointed at ``nbresponses serve``, and ``nbresponses.harness.EngineLM`` in the kernel,
give the same accuracy, perplexities, generations and per-sample logprobs, at batch sizes 1
and 8 (the engine is batch-invariant)."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest
from helpers.server import ThreadedServer

lm_eval = pytest.importorskip("lm_eval")
pytestmark = pytest.mark.timeout(600)

QUESTIONS = [
    ("The capital of France is", [" Paris", " Rome", " Berlin"], 0),
    ("Two plus two equals", [" three", " four", " five"], 1),
    ("The sky on a clear day is", [" green", " red", " blue"], 2),
    ("Water freezes at zero degrees", [" Celsius", " Kelvin"], 0),
    ("A week has", [" seven days", " ten days", " three days"], 0),
    ("The opposite of hot is", [" loud", " cold", " tall"], 1),
]
DOCUMENTS = [
    "The sea was calm and the sky was grey. A small boat left the harbour at dawn.",
    "Numbers can be added, subtracted, multiplied and divided.",
    "She opened the window, and the cold air of the morning came in.",
]
TASKS = ["nbr_mc", "nbr_rolling", "nbr_generate"]


def write_tasks(folder: Path) -> None:
    mc = folder / "mc.jsonl"
    mc.write_text(
        "".join(
            json.dumps({"question": q, "choices": c, "answer": a}) + "\n" for q, c, a in QUESTIONS
        )
    )
    docs = folder / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in DOCUMENTS))
    common = "dataset_path: json\ntest_split: train\n"
    (folder / "nbr_mc.yaml").write_text(
        f"task: nbr_mc\n{common}dataset_kwargs:\n  data_files: {mc}\n"
        "output_type: multiple_choice\ndoc_to_text: '{{question}}'\n"
        "doc_to_choice: '{{choices}}'\ndoc_to_target: '{{answer}}'\n"
        "metric_list:\n  - metric: acc\n"
    )
    (folder / "nbr_rolling.yaml").write_text(
        f"task: nbr_rolling\n{common}dataset_kwargs:\n  data_files: {docs}\n"
        "output_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\n"
        "metric_list:\n  - metric: word_perplexity\n  - metric: byte_perplexity\n"
        "  - metric: bits_per_byte\n"
    )
    (folder / "nbr_generate.yaml").write_text(
        f"task: nbr_generate\n{common}dataset_kwargs:\n  data_files: {mc}\n"
        "output_type: generate_until\ndoc_to_text: '{{question}}'\n"
        "doc_to_target: '{{choices[answer]}}'\n"
        "generation_kwargs:\n  until: ['\\n', '.']\n  max_gen_toks: 8\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n"
    )


def evaluate(lm, folder: Path, batch_size: int, **model_args) -> dict:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    return simple_evaluate(
        model=lm,
        model_args=model_args or None,
        tasks=TASKS,
        task_manager=TaskManager(include_path=str(folder)),
        batch_size=batch_size,
        log_samples=True,
        verbosity="WARNING",
    )


def per_sample(results: dict) -> dict:
    """Each task's per-document responses (logprob and greedy flag, or generated text)."""
    return {
        task: [(s["doc_id"], s["filtered_resps"]) for s in sorted(
            results["samples"][task], key=lambda s: (s["doc_id"], str(s["arguments"]))
        )]
        for task in TASKS
    }  # fmt: skip


def metrics(results: dict) -> dict:
    return {task: results["results"][task] for task in TASKS}


async def test_local_completions_and_the_engine_model_agree(fused_engine, tokenizer_dir, tmp_path):
    from nbresponses.harness import EngineLM

    logging.getLogger("lm-eval").setLevel(logging.WARNING)
    write_tasks(tmp_path)
    runs = {}
    with ThreadedServer(fused_engine.client()) as server:
        for batch_size in (1, 8):
            runs["server", batch_size] = await asyncio.to_thread(
                evaluate,
                "local-completions",
                tmp_path,
                batch_size,
                model=fused_engine.model,
                base_url=f"{server.base_url}/completions",
                tokenizer_backend="huggingface",
                tokenizer=str(tokenizer_dir),
                num_concurrent=1,
                max_retries=1,
            )
    for batch_size in (1, 8):
        model = EngineLM(fused_engine, batch_size=batch_size)
        try:
            runs["kernel", batch_size] = await asyncio.to_thread(
                evaluate, model, tmp_path, batch_size
            )
        finally:
            model.close()
    first = runs["server", 1]
    samples = per_sample(first)
    assert [len(r) for _, r in samples["nbr_mc"]] == [len(c) for _, c, _ in QUESTIONS]
    assert len(samples["nbr_rolling"]) == len(DOCUMENTS)
    assert all(isinstance(r[0], float) for _, r in samples["nbr_rolling"])
    for key, run in runs.items():
        assert per_sample(run) == samples, key  # the same floats, every document, every path
        assert metrics(run) == metrics(first), key
    assert 0 <= first["results"]["nbr_mc"]["acc,none"] <= 1
    assert first["results"]["nbr_rolling"]["word_perplexity,none"] > 1
