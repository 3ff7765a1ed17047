"""``zoo serve``: a model behind the OpenAI HTTP API."""

from __future__ import annotations

import argparse
import sys

from ..errors import ZooError
from .parser import Command, non_negative, positive, seconds
from .source import add_model_loading, check_model, given_tokenizer, load_for_generation

__all__ = ["COMMANDS"]


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve a model over the OpenAI HTTP API (/v1/completions, /v1/chat/completions,
    /v1/models) with continuous batching, until Ctrl+C or SIGTERM (which lets the requests
    in flight finish)."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ZooError(
            f"zoo serve needs FastAPI and uvicorn ({exc}): pip install 'torch-zoo[serve]'"
        ) from None
    from ..generation.text import resolve_tokenizer
    from ..nn.slots import check_batchable
    from ..settings import Settings

    api_key = args.api_key if args.api_key is not None else Settings.from_env().api_key
    model = load_for_generation(args)
    check_batchable(model)
    tokenizer = resolve_tokenizer(model, given_tokenizer(args), "zoo serve")
    from ..serve import serve
    from ..serve.server import LOOPBACK

    if args.host not in LOOPBACK and not api_key:
        print(
            f"zoo: warning: serving on {args.host} without an API key: anyone who reaches "
            "this port can use the model (set ZOO_API_KEY or --api-key)",
            file=sys.stderr,
        )
    serve(
        model,  # type: ignore[arg-type]  # a DecoderLM: check_batchable said so
        tokenizer,
        model_id=args.served_model_name or args.source,
        host=args.host,
        port=args.port,
        api_key=api_key,
        max_batch=args.max_batch,
        max_queue=args.max_queue,
        max_len=args.max_model_len,
        max_body_bytes=args.max_body_bytes,
        drain_timeout=args.drain_timeout,
        header_timeout=args.header_timeout,
        body_timeout=args.body_timeout,
        keep_alive=args.keep_alive,
        max_connections=args.max_connections,
        log_level=args.log_level,
    )
    return 0


def _check_serve(args: argparse.Namespace) -> None:
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be from 0 to 65535 (0 picks a free port), got {args.port}")
    check_model(args)


def _serve_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``zoo serve``."""
    p.add_argument(
        "source",
        metavar="NAME_OR_SOURCE",
        help="named model (official weights), hf:org/name[@rev], or a directory",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port (default: 8000)")
    p.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on every request (default: ZOO_API_KEY, "
        "else none; prefer the variable: a command line is visible to other users)",
    )
    p.add_argument(
        "--served-model-name",
        metavar="NAME",
        default=None,
        help="the model name clients send (default: NAME_OR_SOURCE as given)",
    )
    p.add_argument(
        "--max-batch",
        type=positive,
        default=8,
        help="sequences decoding together; requests join between steps (default: 8)",
    )
    p.add_argument(
        "--max-queue",
        type=non_negative,
        default=64,
        help="sequences waiting for a free slot; beyond it requests get 429 (default: 64)",
    )
    p.add_argument(
        "--max-model-len",
        type=positive,
        default=None,
        help="prompt plus new tokens per sequence (the cache's length; default: the context)",
    )
    p.add_argument(
        "--max-body-bytes",
        type=positive,
        default=4 * 2**20,
        help="larger request bodies get 413 (default: 4 MiB)",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=60.0,
        help="seconds the requests in flight may take to finish after SIGTERM (default: 60)",
    )
    p.add_argument(
        "--header-timeout",
        type=seconds,
        default=10.0,
        help="seconds a client may take to send a request's headers; then 408 (default: 10)",
    )
    p.add_argument(
        "--body-timeout",
        type=seconds,
        default=30.0,
        help="seconds a client may take to send a request's body after its headers; then 408 "
        "(default: 30)",
    )
    p.add_argument(
        "--keep-alive",
        type=seconds,
        default=5.0,
        help="seconds an idle connection stays open between requests (default: 5)",
    )
    p.add_argument(
        "--max-connections",
        type=positive,
        default=None,
        help="connections open at once; beyond it the one idle longest is closed, or 503 when "
        "every one has a request in progress (default: 1024, or less to stay under ulimit -n)",
    )
    p.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default="info",
        help="uvicorn's; warning drops the line per request (default: info)",
    )
    p.add_argument(
        "--tokenizer",
        metavar="NAME",
        default=None,
        help="a named model's or a registered tokenizer's name (default: the model's own)",
    )
    add_model_loading(p, compile=False)  # the batched step is not compiled
    p.add_argument("--seed", type=int, default=None, help="the random weights' seed (--random)")


COMMANDS = {"serve": Command(cmd_serve, _serve_arguments, _check_serve)}
