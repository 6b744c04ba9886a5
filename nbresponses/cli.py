"""The ``nbresponses`` command: prepare models, list them, stream a demo answer, serve a model,
run lm-evaluation-harness on one."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Sequence
from typing import Any

from nbresponses._extras import MissingExtra, require
from nbresponses.models.errors import ModelError
from nbresponses.models.sources import BUNDLED_ALIAS


class UsageError(Exception):
    """A command line that cannot mean what the user wants."""


def _recipes_help() -> str:
    from nbresponses.models.recipes import AUTO, FIDELITY_BAR, RECIPES

    lines = [f"  {AUTO:14} fastest recipe with >= {FIDELITY_BAR:.0%} top-1 agreement (default)"]
    lines += [f"  {r.name:14} {r.description}" for r in RECIPES.values()]
    return "quantization recipes:\n" + "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nbresponses",
        description="The OpenAI Responses API in the Jupyter kernel, on ONNX Runtime.",
    )
    parser.add_argument(
        "--cache-dir", help="model cache (default: $NBRESPONSES_CACHE_DIR or the user cache dir)"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    prepare = commands.add_parser(
        "prepare",
        help="export, quantize and evaluate a model (cached)",
        description="Export MODEL to ONNX with Optimum, quantize it and measure its fidelity "
        "against the fp32 export. MODEL is the bundled alias 'smollm2-135m-instruct' (default), "
        "a .gguf file, a Hugging Face folder or a hub id.",
        epilog=_recipes_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    prepare.add_argument("model", nargs="?", default=None, help="model source (default: bundled)")
    prepare.add_argument(
        "-q",
        "--quantization",
        default=None,
        metavar="RECIPE",
        help="recipe name, see below (default: auto)",
    )
    prepare.add_argument("--quiet", action="store_true", help="no progress bars")

    commands.add_parser("models", help="list prepared models with size and fidelity")

    demo = commands.add_parser("demo", help="stream an answer from a model in the terminal")
    demo.add_argument("prompt", nargs="?", default=None, help="what to ask")
    demo.add_argument("--model", default=None, help="model source (default: bundled)")
    demo.add_argument("-q", "--quantization", default=None, metavar="RECIPE")
    demo.add_argument("--max-tokens", type=int, default=128)
    demo.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")

    serve = commands.add_parser(
        "serve",
        help="serve a model over HTTP: the OpenAI Responses API at /v1/responses",
        description="Serve MODEL (default: bundled) with the OpenAI Responses API over HTTP/SSE "
        "on uvicorn. Loopback only unless --host says otherwise; give --api-key (or set "
        "NBRESPONSES_API_KEY) to require 'Authorization: Bearer KEY'.",
    )
    serve.add_argument("model", nargs="?", default=None, help="model source (default: bundled)")
    serve.add_argument("-q", "--quantization", default=None, metavar="RECIPE")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", default=None, help="require this bearer key")
    serve.add_argument(
        "--grace", type=float, default=10.0, help="seconds in-flight work may finish on shutdown"
    )
    serve.add_argument(
        "--store",
        default=None,
        metavar="PATH",
        help="SQLite file of stored responses, shared with notebooks on this machine "
        "(default: $NBRESPONSES_STORE, else responses.sqlite3 in the user data dir); "
        "'memory' keeps them in this process only, 'off' keeps none",
    )
    evaluate = commands.add_parser(
        "eval",
        help="run lm-evaluation-harness on a model in this process (no server)",
        description="Run lm-evaluation-harness ('lm-eval run') with its model 'nbresponses': "
        "the engine in this process, no server. Every argument not listed here goes to lm-eval "
        "as it is (--tasks, --limit, --num_fewshot, --output_path, --model_args, --log_samples, "
        "--include_path...; see 'lm-eval run --help'). Results saved with --output_path go "
        "under a folder named after the model.",
        allow_abbrev=False,
    )
    evaluate.add_argument(
        "--model",
        default=None,
        help=f"model source, as for 'prepare' (default: the bundled {BUNDLED_ALIAS!r})",
    )
    evaluate.add_argument("-q", "--quantization", default=None, metavar="RECIPE")
    return parser


def lm_eval_argv(args: argparse.Namespace, rest: Sequence[str]) -> list[str]:
    """The ``lm-eval run`` arguments for ``nbresponses eval``: its model is ``nbresponses``, and
    the model source goes first into ``--model_args`` as ``model=`` (lm-eval names the results
    folder after it; a user's own ``--model_args`` come after and may add to it)."""
    if "-M" in rest:
        raise UsageError(
            "nbresponses eval runs lm-eval's 'nbresponses' model; "
            "--model names the model source (default: the bundled model)."
        )
    model_args = [f"model={args.model or BUNDLED_ALIAS}"]
    if args.quantization:
        model_args.append(f"quantization={args.quantization}")
    if args.cache_dir:
        model_args.append(f"cache_dir={args.cache_dir}")
    return ["run", "--model", "nbresponses", "--model_args", *model_args, *rest]


def cmd_eval(args: argparse.Namespace, rest: Sequence[str]) -> int:
    if importlib.util.find_spec("lm_eval") is None:
        raise MissingExtra("eval", "nbresponses eval", ["lm_eval"])
    argv = lm_eval_argv(args, rest)
    from lm_eval.__main__ import cli_evaluate

    import nbresponses.harness  # noqa: F401  # registers "nbresponses" (lm-eval finds models by import)

    saved = sys.argv
    sys.argv = ["lm-eval", *argv]  # lm-eval's entry point parses sys.argv
    try:
        cli_evaluate()
    except SystemExit as exc:  # lm-eval's own usage errors
        return exc.code if isinstance(exc.code, int) else 2
    finally:
        sys.argv = saved
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    from nbresponses.models.prepare import prepare_model

    model = prepare_model(
        args.model, args.quantization, cache_dir=args.cache_dir, progress=not args.quiet
    )
    print(format_report(model))
    return 0


def format_report(model: object) -> str:
    """The fidelity report a user reads after prepare."""
    from nbresponses.models.prepared import PreparedModel

    assert isinstance(model, PreparedModel)
    manifest = model.manifest
    fid = model.fidelity
    timings = ", ".join(f"{k} {v:.1f}s" for k, v in manifest.get("timings", {}).items())
    return "\n".join(
        [
            f"model     {model.name} ({manifest['source']['kind']}: {manifest['source']['path']})",
            f"recipe    {model.recipe}: {manifest['recipe']['description']}",
            f"size      {model.size_bytes / 1e6:.1f} MB   folder {model.path}",
            f"cpu       {', '.join(manifest['cpu']['flags']) or 'no SIMD flags found'}",
            f"fidelity  teacher-forced vs fp32: {model.fidelity_summary()}",
            *(
                f"          {name} text: {part['tokens']} tokens, top-1 "
                f"{part['top1_agreement']:.1%}, |Δ logprob| mean "
                f"{part['mean_abs_dlogprob']:.4f} p99 {part['p99_abs_dlogprob']:.3f}"
                for name, part in fid.get("by_text", {}).items()
            ),
            f"timings   {timings}",
        ]
    )


def cmd_models(args: argparse.Namespace) -> int:
    from nbresponses.models.cache import cache_root
    from nbresponses.models.prepared import list_models

    models = list_models(args.cache_dir)
    if not models:
        print(f"No prepared models in {cache_root(args.cache_dir)}. Try: nbresponses prepare")
        return 0
    header = (
        f"{'name':28} {'recipe':14} {'size MB':>8} {'top-1':>7} {'95% CI':>13} "
        f"{'|Δlp| mean':>10} {'p99':>6} {'KL':>7} {'tokens':>6}  path"
    )
    print(header)
    for m in models:
        fid = m.fidelity
        ci = fid.get("top1_ci95")
        p99 = fid.get("p99_abs_dlogprob")
        print(
            f"{m.name:28} {m.recipe:14} {m.size_bytes / 1e6:8.1f} "
            f"{fid.get('top1_agreement', float('nan')):7.1%} "
            f"{f'{ci[0]:.1%}-{ci[1]:.1%}' if ci else '-':>13} "
            f"{fid.get('mean_abs_dlogprob', float('nan')):10.4f} "
            f"{f'{p99:.3f}' if p99 is not None else '-':>6} "
            f"{fid.get('mean_kl', float('nan')):7.4f} {fid.get('tokens', 0):6}  {m.path}"
        )
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from nbresponses.demo import DEFAULT_PROMPT, run_demo

    args.prompt = args.prompt or DEFAULT_PROMPT
    return run_demo(args)


def serve(
    model: str | None = None,
    quantization: str | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    cache_dir: str | None = None,
    store: str | None = None,
    **server_options: Any,
) -> None:
    """Serve ``model`` (default: the bundled one) at ``http://HOST:PORT/v1`` until interrupted;
    the engine closes after the server drained."""
    import asyncio
    import os

    from nbresponses.engine import Engine
    from nbresponses.server.serve import is_loopback, make_server
    from nbresponses.service.footprint import bound_free_heap

    bound_free_heap()  # before the model loads: a server's heap stays flat (footprint.py: why)
    api_key = api_key or os.environ.get("NBRESPONSES_API_KEY") or None
    if not is_loopback(host) and api_key is None:
        print(
            f"warning: serving on {host} without an API key: anyone who can reach this "
            "address can use the model (set --api-key or NBRESPONSES_API_KEY).",
            file=sys.stderr,
        )

    async def run() -> None:
        engine = await Engine.load(model, quantization, cache_dir=cache_dir, store_path=store)
        try:
            server = make_server(
                engine.client(), host=host, port=port, api_key=api_key, **server_options
            )
            await server.serve()
        finally:
            await engine.aclose()

    asyncio.run(run())


def cmd_serve(args: argparse.Namespace) -> int:
    serve(
        args.model,
        args.quantization,
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        cache_dir=args.cache_dir,
        store=args.store,
        grace=args.grace,
    )
    return 0


COMMANDS = {"prepare": cmd_prepare, "models": cmd_models, "demo": cmd_demo, "serve": cmd_serve}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and args.command != "eval":  # only eval passes arguments on (to lm-eval)
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        require("engine", f"nbresponses {args.command}")
        if args.command == "eval":
            return cmd_eval(args, rest)
        return COMMANDS[args.command](args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (ModelError, MissingExtra) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
