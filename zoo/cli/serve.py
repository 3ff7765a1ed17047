"""``zoo serve``: a model behind the OpenAI HTTP API."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ZooError
from .bounds import check_counts, check_seed_flag, serve_bounds
from .parser import Command, non_negative, non_negative_float, positive, seconds
from .source import add_model_loading, check_model, given_tokenizer, load_for_generation

if TYPE_CHECKING:
    from ..adapters import Adapter
    from ..nn.base import ZooModel

__all__ = ["COMMANDS"]


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve a model over the OpenAI HTTP API (/v1/completions, /v1/chat/completions,
    /v1/models) with continuous batching, until Ctrl+C or SIGTERM (which lets the requests
    in flight finish)."""
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ZooError(
            f"zoo serve needs FastAPI, uvicorn and prometheus_client ({exc}): "
            "pip install 'torch-zoo[serve]'"
        ) from None
    from ..generation.text import resolve_tokenizer
    from ..runtime.encdec_slots import check_encoder_decoder_batchable
    from ..runtime.slots import check_batchable
    from ..settings import Settings

    settings = Settings.from_env()
    keys = api_keys(args, settings.api_key)
    model, adapters = _load_served(args)
    if model.is_encoder_decoder:  # a completion's prompt is the source (zoo.serve.encdec_runner)
        check_encoder_decoder_batchable(model)
    else:
        check_batchable(model)
    tokenizer = resolve_tokenizer(model, given_tokenizer(args), "zoo serve")
    from ..serve import serve
    from ..serve.server import LOOPBACK

    if args.host not in LOOPBACK and not keys:
        print(
            f"zoo: warning: serving on {args.host} without an API key: anyone who reaches "
            "this port can use the model (set ZOO_API_KEY or --api-key)",
            file=sys.stderr,
        )
    serve(
        model,  # type: ignore[arg-type]  # a DecoderLM or an encoder-decoder: checked above
        tokenizer,
        model_id=args.served_model_name or args.source,
        host=args.host,
        port=args.port,
        api_keys=keys,
        shared_prefix_cache=args.shared_prefix_cache,
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
        adapters=adapters,
        prefill_chunk=args.prefill_chunk or None,
        max_stall=args.max_stall or None,
        prefix_cache_bytes=args.prefix_cache_mb * 2**20,
        decode_threads=settings.decode_threads,
        compile=args.compile,
        cuda_graphs=settings.cuda_graphs,
    )
    return 0


def api_keys(args: argparse.Namespace, environment: str | None) -> list[str]:
    """The keys ``zoo serve`` takes: each ``--api-key``, then each line of each
    ``--api-key-file`` (blank lines and ``#`` comments left out); without either,
    ``ZOO_API_KEY`` (``environment``) if set. A key file that holds no key is an error."""
    keys = list(args.api_key)
    for name in args.api_key_file:
        try:
            lines = Path(name).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"--api-key-file {name}: cannot read it ({exc})") from None
        found = [
            line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")
        ]
        if not found:
            raise ValueError(
                f"--api-key-file {name} holds no key: write one key a line (lines starting "
                "with # are comments)"
            )
        keys += found
    if not keys and environment:
        keys.append(environment)
    return keys


def _load_served(args: argparse.Namespace) -> tuple[ZooModel, dict[str, Adapter]]:
    """The model to serve and its ``--adapter`` s by name: every adapter fetched first (a bad
    one loads no base), then the float base, which each adapter's record must match (its
    sha256 on the float weights, before ``--quantize``), then the quantization."""
    if not args.adapter:
        return load_for_generation(args), {}
    import torch

    from .. import loading
    from ..adapters import base_fingerprint, check_adapter_base, read_adapter
    from ..adapters.lora import adapted_layers
    from ..errors import CheckpointError
    from ..nn.linear import use_onednn
    from ..quant.layers import quantize_

    folders = {name: loading.adapter_directory(source) for name, source in args.adapter}
    dtype = getattr(torch, args.dtype) if args.dtype else None
    model = loading.load(args.source, device=args.device, dtype=dtype, onednn=False)
    if adapted_layers(model):
        raise ValueError(
            f"{args.source} is an adapter (or a LoRA run), not a base: serve its base and "
            f"name each adapter with --adapter NAME=ADAPTER (zoo info {args.source} names "
            "the base)"
        )
    fingerprint = base_fingerprint(model)
    adapters = {}
    for name, folder in folders.items():
        adapter = read_adapter(folder, model=model)
        try:
            check_adapter_base(adapter, fingerprint, model)
        except CheckpointError as exc:
            raise exc.reworded(f"--adapter {name}: {exc}") from None
        adapters[name] = adapter
    if args.quantize:
        with torch.no_grad():
            quantize_(model, args.quantize)
    use_onednn(model)
    return model, adapters


def adapter_spec(text: str) -> tuple[str, str]:
    """``--adapter``'s value as ``(model name, adapter)``: ``NAME=ADAPTER``, or ``ADAPTER``
    alone, served under the name as given."""
    name, equals, source = text.partition("=")
    if not equals:
        return text, text
    if not name.strip() or not source.strip():
        raise argparse.ArgumentTypeError(
            f"{text!r}: give NAME=ADAPTER (the model name requests use, then an adapter "
            "folder or hf:org/name), e.g. --adapter notes=runs/notes"
        )
    return name, source


def _check_serve(args: argparse.Namespace) -> None:
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be from 0 to 65535 (0 picks a free port), got {args.port}")
    check_counts(args, serve_bounds())
    check_seed_flag(args.seed)
    check_model(args)
    if args.compile and args.adapter:
        raise ValueError(
            "--compile compiles a decoding step without per-row LoRA adapters; serve the "
            "adapters without --compile (or merge one into the base: zoo merge)"
        )
    _check_adapters(args)


def _check_adapters(args: argparse.Namespace) -> None:
    """Each ``--adapter`` names an adapter (no torch), under a name of its own."""
    if not args.adapter:
        return
    from .. import loading

    if args.random:
        raise ValueError(
            "--adapter needs the base's weights (an adapter records them by their sha256); "
            "leave out --random"
        )
    names = [name for name, _ in args.adapter]
    base = args.served_model_name or args.source
    taken = sorted({n for n in names if names.count(n) > 1 or n == base})
    if taken:
        raise ValueError(
            f"--adapter names {taken} twice (or as the base model {base!r} is named): give "
            "each adapter a name of its own, --adapter NAME=ADAPTER"
        )
    for _, source in args.adapter:
        loading.check_adapter(source)


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
        metavar="KEY",
        action="append",
        default=[],
        help="require 'Authorization: Bearer KEY' on every request (repeatable: each client "
        "a key of its own; default: ZOO_API_KEY, else none; prefer the variable or "
        "--api-key-file: a command line is visible to other users)",
    )
    p.add_argument(
        "--api-key-file",
        metavar="FILE",
        action="append",
        default=[],
        help="take the keys in FILE, one a line (# starts a comment; repeatable)",
    )
    p.add_argument(
        "--shared-prefix-cache",
        action="store_true",
        help="let requests of different API keys reuse each other's prompts from the prefix "
        "cache (by default each key's are kept apart: a fast first token would tell one "
        "client that another sent a prompt)",
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
        "--prefill-chunk",
        type=non_negative,
        default=512,
        metavar="TOKENS",
        help="prompt tokens prefilled per step at most, so a long prompt enters over several "
        "steps while the running streams keep emitting; 0: whole prompts (default: 512)",
    )
    p.add_argument(
        "--max-stall",
        type=non_negative_float,
        default=2.0,
        metavar="STEPS",
        help="while streams decode, a step's prompt chunk is sized to take at most about this "
        "many decoding steps (timed as the server runs), times the prompts waiting per stream "
        "where more wait than decode; 0: only --prefill-chunk bounds it (default: 2)",
    )
    p.add_argument(
        "--prefix-cache-mb",
        type=non_negative,
        default=512,
        metavar="MB",
        help="memory for the keys and values of prompt prefixes kept between requests (a "
        "system prompt, a chat's turns so far); 0 turns it off (default: 512)",
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
    p.add_argument(
        "--adapter",
        metavar="NAME=ADAPTER",
        type=adapter_spec,
        action="append",
        default=[],
        help="serve a LoRA adapter on the model as the model NAME (repeatable: requests for "
        "different adapters and the base share each decoding step); ADAPTER: a folder with "
        "adapter_config.json (peft's or zoo train --lora's), a LoRA run's folder, or "
        "hf:org/name[@rev]; its recorded base must be the model. Without NAME=, the name "
        "is ADAPTER as given",
    )
    add_model_loading(p)
    p.add_argument("--seed", type=int, default=None, help="the random weights' seed (--random)")


COMMANDS = {"serve": Command(cmd_serve, _serve_arguments, _check_serve)}
