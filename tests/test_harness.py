"""lm-evaluation-harness, offline, on a small task written here: its ``local-completions``
model pointed at ``nbresponses serve`` (with the tokenizer's folder, or with no tokenizer at all:
``GET /tokenizer_info`` and ``/tokenize``, vLLM's routes), ``nbresponses.harness.EngineLM`` in the
kernel, and ``nbresponses eval`` from the shell give the same accuracy, perplexities, generations
and per-sample logprobs, at batch sizes 1 and 8 (the engine is batch-invariant).

On the bundled model, lm-eval's ``local-chat-completions`` with ``--apply_chat_template`` and
``local-completions`` on a ``generate_until`` task with four ``until`` strings (five ``stop``
strings on the wire) give the kernel's answers to the same requests."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest
from helpers.responses import client_for
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


def evaluate(lm, folder: Path, batch_size: int, tasks=TASKS, **model_args) -> dict:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    return simple_evaluate(
        model=lm,
        model_args=model_args or None,
        tasks=tasks,
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


def test_tokenizer_info_is_what_lm_evals_remote_tokenizer_reads(tokenizer, tokenizer_dir) -> None:
    """``GET /tokenizer_info`` in vLLM's shape, read by lm-eval's own ``RemoteTokenizer``: its
    special tokens, ids and chat template are those of the tokenizer the model was prepared with,
    and no path on the server's disk is published."""
    from lm_eval.utils import RemoteTokenizer, check_remote_tokenizer_support

    client, _ = client_for(tokenizer, "unused")
    with ThreadedServer(client) as server, server.http() as http:
        info = http.get("/tokenizer_info").json()
        base_url = f"{server.base_url}/completions"  # what a user gives local-completions
        assert check_remote_tokenizer_support(base_url, max_retries=1)
        remote = RemoteTokenizer(base_url, max_retries=1)
        assert (remote.eos_token, remote.bos_token, remote.pad_token) == (
            tokenizer.eos_token,
            tokenizer.bos_token,
            tokenizer.pad_token,
        )
        assert (remote.eos_token_id, remote.bos_token_id) == (
            tokenizer.eos_token_id,
            tokenizer.bos_token_id,
        )
        text = "The capital of France is Paris."
        assert remote.encode(text) == tokenizer.encode(text, add_special_tokens=False)
        chat = [{"role": "user", "content": "Hi"}]
        assert remote.apply_chat_template(chat) == tokenizer.apply_chat_template(
            chat, tokenize=False, add_generation_prompt=True
        )
    with ThreadedServer(client, api_key="key") as server, server.http() as http:
        assert http.get("/tokenizer_info").status_code == 401  # like every route but /health
        keyed = http.get("/tokenizer_info", headers={"authorization": "Bearer key"})
        assert keyed.json() == info
    assert info["tokenizer_class"] == type(tokenizer).__name__
    assert info["chat_template"] == tokenizer.chat_template
    assert info["name_or_path"] == client.model
    assert str(tokenizer_dir) not in json.dumps(info)


@pytest.mark.slow
async def test_local_completions_and_the_engine_model_agree(fused_engine, tokenizer_dir, tmp_path):
    from lm_eval.api.registry import get_model

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
        # as lm-eval's users run it: no tokenizer named, lm-eval's default backend ("auto")
        # finds /tokenizer_info and tokenizes through the server, offline
        remote = get_model("local-completions")(
            model=fused_engine.model,
            base_url=f"{server.base_url}/completions",
            num_concurrent=1,
            max_retries=1,
        )
        assert remote.tokenizer_backend == "remote"
        runs["server, remote tokenizer", 1] = await asyncio.to_thread(evaluate, remote, tmp_path, 1)
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


@pytest.mark.slow
async def test_nbresponses_eval_runs_lm_eval_in_process(
    fused_engine, tiny_source, cache_dir, tmp_path
) -> None:
    """``nbresponses eval`` hands lm-eval's own arguments through, runs the ``nbresponses`` model
    without a server, and files the results under the model's name; its per-sample logprobs are
    those of ``EngineLM`` on the same prepared model."""
    from lm_eval.utils import sanitize_model_name

    from nbresponses.cli import main as cli_main
    from nbresponses.harness import EngineLM

    logging.getLogger("lm-eval").setLevel(logging.WARNING)
    write_tasks(tmp_path)
    out = tmp_path / "results"
    argv = ["--cache-dir", str(cache_dir), "eval", "--model", str(tiny_source)]
    argv += ["-q", "fused-fp32", "--tasks", "nbr_mc", "--include_path", str(tmp_path)]
    argv += ["--output_path", str(out), "--log_samples", "--verbosity", "WARNING"]
    assert await asyncio.to_thread(cli_main, argv) == 0
    [folder] = out.iterdir()
    assert folder.name == sanitize_model_name(str(tiny_source))  # lm-eval's rule, not a random id
    [results_file] = folder.glob("results_*.json")
    [samples_file] = folder.glob("samples_nbr_mc_*.jsonl")
    results = json.loads(results_file.read_text())
    assert results["config"]["model"] == "nbresponses"
    samples = [json.loads(line) for line in samples_file.read_text().splitlines()]
    assert len(samples) == len(QUESTIONS)
    shell = sorted((s["doc_id"], s["filtered_resps"]) for s in samples)

    model = EngineLM(fused_engine)  # the same prepared model (fused-fp32 of tiny_source)
    assert fused_engine.prepared.path.name.startswith(tiny_source.name)
    try:
        kernel = await asyncio.to_thread(evaluate, model, tmp_path, 1, ["nbr_mc"])
    finally:
        model.close()
    # the samples file keeps each response as text: str() of a float is its exact repr
    in_kernel = sorted(
        (s["doc_id"], [[str(lp), str(greedy)] for lp, greedy in s["filtered_resps"]])
        for s in kernel["samples"]["nbr_mc"]
    )
    assert in_kernel == shell
    assert results["results"]["nbr_mc"]["acc,none"] == kernel["results"]["nbr_mc"]["acc,none"]


# -- lm-eval's OpenAI-compatible models on the bundled model, as users run them ---------------

UNTIL = ["\n", ".", ",", "!"]  # four: lm-eval adds the end-of-text string as a fifth
MAX_GEN_TOKS = 24


def write_until_task(folder: Path) -> str:
    """A ``generate_until`` task with four ``until`` strings over ``QUESTIONS``."""
    mc = folder / "until.jsonl"
    mc.write_text(
        "".join(
            json.dumps({"question": q, "choices": c, "answer": a}) + "\n" for q, c, a in QUESTIONS
        )
    )
    (folder / "nbr_until.yaml").write_text(
        f"task: nbr_until\ndataset_path: json\ntest_split: train\ndataset_kwargs:\n"
        f"  data_files: {mc}\noutput_type: generate_until\ndoc_to_text: '{{{{question}}}}'\n"
        "doc_to_target: '{{choices[answer]}}'\n"
        f"generation_kwargs:\n  until: {json.dumps(UNTIL)}\n  max_gen_toks: {MAX_GEN_TOKS}\n"
        "  do_sample: false\nmetric_list:\n  - metric: exact_match\n"
    )
    return "nbr_until"


@pytest.fixture
async def bundled_engine(bundled_model):
    from nbresponses.engine import Engine
    from nbresponses.runtime.generator import TokenGenerator

    engine = Engine(TokenGenerator(bundled_model), store_path="memory")
    yield engine
    await engine.aclose()


def generations(results: dict, task: str) -> list[tuple[int, str, str]]:
    """Each document's context (as lm-eval sent it: a chat history is a ``JsonChatStr``, a
    one-field tuple of its JSON) and generation."""

    def text(context: str | tuple[str]) -> str:
        return context if isinstance(context, str) else context[0]

    return sorted(
        (s["doc_id"], text(s["arguments"][0][0]), s["resps"][0][0])
        for s in results["samples"][task]
    )


@pytest.mark.slow
async def test_local_chat_completions_with_a_chat_template_gives_the_kernels_answers(
    bundled_engine, tmp_path
) -> None:
    """``--model local-chat-completions --apply_chat_template`` against ``serve``: lm-eval sends
    the conversation, ``max_tokens``, ``temperature: 0``, ``seed`` and its ``until`` strings as
    ``stop``; each answer is the one ``engine.openai().chat.completions.create`` gives in the
    kernel for the same body."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    logging.getLogger("lm-eval").setLevel(logging.WARNING)
    task = write_until_task(tmp_path)
    engine = bundled_engine
    with ThreadedServer(engine.client()) as server:
        results = await asyncio.to_thread(
            simple_evaluate,
            model="local-chat-completions",
            model_args={
                "model": engine.model,
                "base_url": f"{server.base_url}/chat/completions",
                "num_concurrent": 1,
                "max_retries": 1,
            },
            tasks=[task],
            task_manager=TaskManager(include_path=str(tmp_path)),
            apply_chat_template=True,
            log_samples=True,
            verbosity="WARNING",
        )
    rows = generations(results, task)
    assert len(rows) == len(QUESTIONS)
    sdk = engine.openai()
    stopped = 0
    for (doc_id, context, answer), (question, _, _) in zip(rows, QUESTIONS, strict=True):
        messages = json.loads(context)  # lm-eval's chat history, sent as `messages`
        assert messages == [{"role": "user", "content": question}], doc_id
        kernel = await sdk.chat.completions.create(
            model=engine.model, messages=messages, max_tokens=MAX_GEN_TOKS, temperature=0,
            stop=UNTIL, seed=1234,
        )  # fmt: skip
        choice = kernel.choices[0]
        assert answer == choice.message.content, doc_id
        assert not any(s in answer for s in UNTIL), doc_id  # cut before its stop string
        stopped += choice.finish_reason == "stop"
    assert stopped > 0  # the stop strings were met, not only the token budget


@pytest.mark.slow
async def test_local_completions_with_five_stop_strings_gives_the_kernels_answers(
    bundled_engine, tmp_path
) -> None:
    """``--model local-completions`` on a ``generate_until`` task with four ``until`` strings:
    lm-eval adds the end-of-text string as a fifth ``stop`` (OpenAI's limit is four; vLLM and
    ``serve`` take any number); each generation is the kernel's for the same prompt ids."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    logging.getLogger("lm-eval").setLevel(logging.WARNING)
    task = write_until_task(tmp_path)
    engine = bundled_engine
    tokenizer = engine.client().family.tokenizer
    with ThreadedServer(engine.client()) as server:
        results = await asyncio.to_thread(
            simple_evaluate,
            model="local-completions",
            model_args={
                "model": engine.model,
                "base_url": f"{server.base_url}/completions",  # tokenizer: /tokenizer_info
                "num_concurrent": 1,
                "max_retries": 1,
            },
            tasks=[task],
            task_manager=TaskManager(include_path=str(tmp_path)),
            log_samples=True,
            verbosity="WARNING",
        )
    rows = generations(results, task)
    assert len(rows) == len(QUESTIONS)
    stop = [*UNTIL, tokenizer.eos_token]
    assert len(stop) == 5
    sdk = engine.openai()
    stopped = 0
    for (doc_id, context, answer), (question, _, _) in zip(rows, QUESTIONS, strict=True):
        assert context == question
        kernel = await sdk.completions.create(
            model=engine.model, prompt=tokenizer.encode(question, add_special_tokens=False),
            max_tokens=MAX_GEN_TOKS, temperature=0, stop=stop, seed=1234,
        )  # fmt: skip
        assert answer == kernel.choices[0].text, doc_id
        assert not any(s in answer for s in stop), doc_id
        stopped += kernel.choices[0].finish_reason == "stop"
    assert stopped > 0
