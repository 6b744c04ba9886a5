"""A first prepare shows one stage bar, none of the libraries'; progress=False shows nothing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nbresponses.models.prepare import prepare_model
from nbresponses.models.progress import quiet_library_bars

BAR = re.compile(r"(\S[^\r\n|]*?):\s+\d+%\|")  # "<desc>:  50%|" of a tqdm bar


def _bar_names(text: str) -> set[str]:
    return set(BAR.findall(text))


def test_library_bars_are_off_inside_and_restored_after(capfd: pytest.CaptureFixture) -> None:
    from huggingface_hub.utils import are_progress_bars_disabled
    from huggingface_hub.utils import tqdm as hub_tqdm
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    assert hf_logging.is_progress_bar_enabled() and not are_progress_bars_disabled()
    with quiet_library_bars():
        for _ in hf_logging.tqdm(range(3), desc="transformers bar"):
            pass
        for _ in hub_tqdm(range(3), desc="hub bar"):
            pass
        for _ in gguf_utils.tqdm(range(3), desc="GGUF bar"):  # a plain tqdm.auto
            pass
    out, err = capfd.readouterr()
    assert out + err == ""
    assert hf_logging.is_progress_bar_enabled() and not are_progress_bars_disabled()
    for _ in gguf_utils.tqdm(range(3), desc="GGUF bar"):
        pass
    assert "GGUF bar" in capfd.readouterr().err  # restored


@pytest.mark.slow
def test_first_prepare_shows_one_stage_bar(
    tiny_source: Path, tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    prepare_model(tiny_source, "fp32", cache_dir=tmp_path, progress=True)
    out, err = capfd.readouterr()
    assert out == ""
    assert _bar_names(err) == {"prepare tiny-llama-src"}, err
    final = err.replace("\r", "\n").strip().splitlines()[-1]
    assert "4/4" in final and "done" in final, final

    prepare_model(tiny_source, "fp32", cache_dir=tmp_path, progress=True)  # cached: no bar
    out, err = capfd.readouterr()
    assert out + err == ""


@pytest.mark.slow
def test_prepare_without_progress_prints_nothing(
    tiny_source: Path, tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    prepared = prepare_model(tiny_source, "fp32", cache_dir=tmp_path, progress=False)
    out, err = capfd.readouterr()
    assert out + err == ""
    assert set(prepared.manifest["timings"]) == {"load", "export", "quantize", "evaluate"}


@pytest.mark.slow
async def test_engine_load_without_progress_prints_nothing(
    tiny_source: Path, tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    from nbresponses.engine import Engine

    engine = await Engine.load(tiny_source, "fp32", cache_dir=tmp_path, progress=False)
    try:
        await engine.client().responses.create(input="Hi", max_output_tokens=2, temperature=0)
    finally:
        await engine.aclose()
    out, err = capfd.readouterr()
    assert out + err == ""
