"""The command line: ``nbresponses prepare``, ``models``, ``demo`` and ``eval``'s arguments, and
the demo's summary (``eval`` running lm-eval: tests/test_harness.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paths import ROOT

from nbresponses.cli import UsageError, build_parser, lm_eval_argv
from nbresponses.cli import main as cli_main
from nbresponses.models.recipes import RECIPES


def test_cli_prepare_and_models(tiny_source: Path, cache_dir, capsys) -> None:
    assert (
        cli_main(
            ["--cache-dir", str(cache_dir), "prepare", str(tiny_source), "-q", "fp32", "--quiet"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "top-1 100.0% (95% CI" in out and "recipe    fp32" in out
    assert cli_main(["--cache-dir", str(cache_dir), "models"]) == 0
    assert "tiny-llama-src" in capsys.readouterr().out
    assert cli_main(["prepare", "does-not-exist"]) == 2
    assert "Accepted" in capsys.readouterr().err


def test_cli_help_lists_recipes() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "nbresponses", "prepare", "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    ).stdout
    for name in RECIPES:
        assert name in out


def test_demo_summary_reports_usage_speed_and_first_token_margin() -> None:
    from openai.types.responses import Response
    from openai.types.responses.response_output_text import Logprob, LogprobTopLogprob

    from nbresponses.demo import summary

    final = Response.model_validate(
        {
            "id": "resp_1",
            "object": "response",
            "created_at": 0,
            "model": "m",
            "output": [],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "status": "completed",
            "usage": {
                "input_tokens": 40,
                "input_tokens_details": {"cached_tokens": 8, "cache_write_tokens": 0},
                "output_tokens": 11,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 51,
            },
        }
    )
    first = Logprob(
        token="The",
        bytes=[84, 104, 101],
        logprob=-0.5,
        top_logprobs=[
            LogprobTopLogprob(token="The", bytes=[], logprob=-0.5),
            LogprobTopLogprob(token="L", bytes=[], logprob=-1.5),
        ],
    )
    text = summary(final, 0.0, 0.5, 1.5, first)
    assert "40 input tokens (8 cached), 11 output" in text
    assert "time to first token 500 ms, decode 10.0 tok/s" in text
    assert "'The' 61%, 'L' 22%" in text


def test_cli_demo_streams_through_the_responses_api(tiny_source, cache_dir, capsys) -> None:
    code = cli_main(
        [
            "--cache-dir",
            str(cache_dir),
            "demo",
            "Hello",
            "--model",
            str(tiny_source),
            "-q",
            "fp32",
            "--max-tokens",
            "5",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0
    assert "[incomplete (max_output_tokens): " in captured.err or "[completed: " in captured.err
    assert "first token" in captured.err


def test_eval_hands_lm_evals_arguments_through_after_the_model() -> None:
    parser = build_parser()
    argv = ["--cache-dir", "/c", "eval", "--tasks", "a", "b", "--model", "m.gguf", "--limit", "2"]
    argv += ["-q", "q8", "--model_args", "batch_size=4", "-o", "out"]
    args, rest = parser.parse_known_args(argv)
    assert lm_eval_argv(args, rest) == [
        "run",
        "--model",
        "nbresponses",
        "--model_args",
        "model=m.gguf",
        "quantization=q8",
        "cache_dir=/c",
        "--tasks",
        "a",
        "b",
        "--limit",
        "2",
        "--model_args",  # lm-eval merges both; the user's keys win
        "batch_size=4",
        "-o",
        "out",
    ]
    args, rest = parser.parse_known_args(["eval", "--tasks", "a"])
    assert lm_eval_argv(args, rest)[3:5] == ["--model_args", "model=smollm2-135m-instruct"]
    args, rest = parser.parse_known_args(["eval", "-M", "hf", "--tasks", "a"])
    with pytest.raises(UsageError, match="--model names the model source"):
        lm_eval_argv(args, rest)


def test_only_eval_passes_unknown_arguments_on(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        cli_main(["models", "--tasks", "a"])
    assert exc.value.code == 2
    assert "unrecognized arguments: --tasks a" in capsys.readouterr().err
