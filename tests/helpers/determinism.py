"""The determinism matrix: one request run in every situation the engine can put it in.

A request's steps (token ids, logprob and top-k floats, finish reason) must be bit-identical to
its cold run alone on a fresh engine: again on the same engine (full prefix hit), after another
prompt sharing part of it (partial hit), among batch-mates of other lengths (all starting
together, or the request joining mid-stream while mates leave at other steps, or taking the row
a finished mate left), in a full batch, on a restarted engine, and as the follow-up turn of a
conversation (before and after the engine re-computed the first answer while idle).
``run_matrix`` returns the situations that differ.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from nbresponses.runtime.generator import TokenGenerator
from nbresponses.tokens.contract import SamplingParams, Step


@dataclass(frozen=True)
class Outcome:
    steps: tuple[Step, ...]

    @property
    def tokens(self) -> list[int]:
        return [t for s in self.steps for t in s.token_ids]


async def run(generator: TokenGenerator, prompt: Sequence[int], params: SamplingParams) -> Outcome:
    return Outcome(tuple([step async for step in generator.generate(prompt, params)]))


async def run_after(
    generator: TokenGenerator, started: asyncio.Event, prompt: Sequence[int], params: SamplingParams
) -> Outcome:
    await started.wait()
    return await run(generator, prompt, params)


async def mate(
    generator: TokenGenerator,
    prompt: Sequence[int],
    tokens: int,
    started: asyncio.Event | None = None,
) -> Outcome:
    """A batch-mate: greedy, ``tokens`` long; sets ``started`` after its third token."""
    params = SamplingParams(max_tokens=tokens, temperature=0, logprobs=True, top_logprobs=2)
    steps = []
    async for step in generator.generate(prompt, params):
        steps.append(step)
        if started is not None and len(steps) == 3:
            started.set()
    return Outcome(tuple(steps))


def differences(reference: Outcome, other: Outcome) -> str | None:
    """None when bit-identical; else where the first difference is."""
    for i, (a, b) in enumerate(zip(reference.steps, other.steps, strict=False)):
        if a != b:
            return f"step {i}: {a} != {b}"
    if len(reference.steps) != len(other.steps):
        return f"{len(reference.steps)} steps != {len(other.steps)}"
    return None


async def run_matrix(
    prepared,
    tokenizer,
    targets: Sequence[Sequence[int]],
    mates: Sequence[Sequence[int]],
    params: SamplingParams,
    follow_up: Sequence[int],
    *,
    max_batch_size: int = 16,
    **engine_options,
) -> list[str]:
    """Every situation in which some target's steps differ from its cold run alone."""
    failures: list[str] = []

    def generator(**options) -> TokenGenerator:
        return TokenGenerator(
            prepared,
            tokenizer=tokenizer,
            max_batch_size=max_batch_size,
            **{**engine_options, **options},
        )

    def check(situation: str, index: int, reference: Outcome, got: Outcome) -> None:
        diff = differences(reference, got)
        if diff:
            failures.append(f"target {index}, {situation}: {diff}")

    mate_lengths = [5 + 7 * i for i in range(len(mates))]  # mates leave at different steps
    for index, target in enumerate(targets):
        async with generator(prefix_cache_bytes=0) as cold:
            reference = await run(cold, target, params)
            conversation = list(target) + reference.tokens + list(follow_up)
            reference_turn = await run(cold, conversation, params)
        async with generator() as eng:  # a restarted engine, then the same request again
            check("restart", index, reference, await run(eng, target, params))
            check("full prefix hit", index, reference, await run(eng, target, params))
            check("follow-up, first answer decoded", index, reference_turn,
                  await run(eng, conversation, params))  # fmt: skip
        async with generator() as eng:
            await run(eng, target, params)
            await eng.wait_idle()  # the first answer re-computed by prefill
            check("follow-up, first answer cached", index, reference_turn,
                  await run(eng, conversation, params))  # fmt: skip
        async with generator() as eng:
            for cut in (len(target) // 2, len(target) // 2 + 1, len(target) - 2):
                await run(eng, list(target[:cut]) + [int(t) for t in mates[0][-3:]], params)
                check(f"partial prefix hit of {cut}", index, reference,
                      await run(eng, target, params))  # fmt: skip
        async with generator(prefix_cache_bytes=0) as eng:
            results = await asyncio.gather(
                run(eng, target, params),
                *(mate(eng, m, n) for m, n in zip(mates, mate_lengths, strict=False)),
            )
            check(f"batched with {len(mates)} mates", index, reference, results[0])
        async with generator(prefix_cache_bytes=0) as eng:
            started = asyncio.Event()
            first, *rest = mates
            results = await asyncio.gather(
                mate(eng, first, 40, started),
                *(mate(eng, m, n) for m, n in zip(rest, mate_lengths, strict=False)),
                run_after(eng, started, target, params),
            )
            check("joining mid-stream", index, reference, results[-1])
        async with generator(prefix_cache_bytes=0) as eng:
            # three mates start together; when the shortest has left, the target takes the
            # row it left (the batch keeps its buffers; the others moved up in place)
            lengths = (40, 30, 4)
            started = [
                asyncio.ensure_future(mate(eng, mates[i % len(mates)], n))
                for i, n in enumerate(lengths)
            ]
            await started[-1]
            got = await run(eng, target, params)
            await asyncio.gather(*started)
            check("in a row a finished mate left", index, reference, got)
        async with generator(prefix_cache_bytes=0) as eng:
            fill = [mates[i % len(mates)] for i in range(max_batch_size - 1)]
            results = await asyncio.gather(
                *(mate(eng, m, 3 + i) for i, m in enumerate(fill)), run(eng, target, params)
            )
            check(f"full batch of {max_batch_size}", index, reference, results[-1])
    return failures


def one_row_kernel_differs(bits: int) -> float:
    """How far a one-row product of a lone ``MatMulNBits`` node (``bits``, block 32, accuracy
    level 4, 2 threads) is from the same row inside a 16-row product, on this CPU (0.0: the
    kernel is row-exact). Measured: 0.0 for 8 bits everywhere; for 4 bits 0.0 with AVX512-VNNI
    and 1.7e-6 on an AVX2-only AMD EPYC, whose one-row 4-bit kernel sums in another order."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    k, n = 576, 960
    rng = np.random.default_rng(0)
    weight = onnx.numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", n])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    config = DefaultWeightOnlyQuantConfig(
        block_size=32, is_symmetric=True, accuracy_level=4, bits=bits
    )
    quantizer = MatMulNBitsQuantizer(
        model, block_size=32, is_symmetric=True, accuracy_level=4, algo_config=config
    )
    quantizer.process()
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(
        quantizer.model.model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    x = rng.standard_normal((16, k)).astype(np.float32)
    alone = session.run(None, {"x": x[:1]})[0][0]
    among = session.run(None, {"x": x})[0][0]
    return float(np.abs(alone - among).max())
