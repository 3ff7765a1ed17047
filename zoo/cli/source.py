"""The model ``zoo generate``, ``chat`` and ``serve`` run: its loading flags (``--device``,
``--dtype``, ``--quantize``, ``--compile``, ``--random``; ``--adapter`` for ``generate`` and
``chat``), their early check and the load."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from .. import api
from ..options import QUANTIZE_MODE_HELP, QUANTIZE_MODES

if TYPE_CHECKING:
    from ..nn.base import ZooModel
    from ..tokenizers import Tokenizer

__all__ = ["add_model_loading", "check_model", "given_tokenizer", "load_for_generation"]

_DTYPES = ("float32", "bfloat16", "float16")


def add_model_loading(
    p: argparse.ArgumentParser, *, compile: bool = True, adapter: bool = False
) -> None:
    """``--device``, ``--dtype``, ``--quantize``, ``--compile`` (unless ``compile`` is false)
    and ``--random``: how :func:`load_for_generation` loads the model; ``--adapter`` (one LoRA
    adapter on it) when ``adapter``."""
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: cpu)")
    p.add_argument("--dtype", choices=_DTYPES, default=None, help="default: as stored")
    p.add_argument(
        "--quantize",
        choices=QUANTIZE_MODES,
        default=None,
        help="quantize the linear layers while loading (default: none): "
        + "; ".join(f"{mode}: {what}" for mode, what in QUANTIZE_MODE_HELP.items()),
    )
    if compile:
        p.add_argument(
            "--compile",
            action="store_true",
            help="compile the decoding step with torch.compile (CPU; needs a C++ compiler; the "
            "first run compiles for a while, later ones reuse torch's cache)",
        )
    p.add_argument(
        "--random",
        action="store_true",
        help="use a randomly initialised named model (no weights, works offline)",
    )
    if not adapter:
        return
    p.add_argument(
        "--adapter",
        metavar="ADAPTER",
        default=None,
        help="apply a LoRA adapter: a folder with adapter_config.json (peft's or zoo train "
        "--lora's), a LoRA run's folder, or hf:org/name[@rev]; its recorded base must be the "
        "model",
    )


def _check_adapter(args: argparse.Namespace) -> None:
    """``--adapter`` names an adapter (no torch), and goes with weights, not ``--random``."""
    from .. import loading

    if args.random:
        raise ValueError(
            "--adapter needs the base's weights (the adapter records them by their sha256); "
            "leave out --random"
        )
    loading.check_adapter(args.adapter)


def check_model(args: argparse.Namespace, *, adapter: bool = False) -> None:
    """``zoo generate``, ``chat`` and ``serve``: the model (a named model with ``--random``)
    and ``--tokenizer`` exist, as loading them will require; with ``adapter``, the
    ``--adapter`` given is one."""
    from .. import loading

    if args.random:
        api.resolve_config(args.source)
    else:
        loading.check_source(args.source, named_adapter=True)
    if args.tokenizer:
        api.check_tokenizer(args.tokenizer)
    if adapter and args.adapter is not None:
        _check_adapter(args)


def load_for_generation(args: argparse.Namespace, adapter: str | None = None) -> ZooModel:
    """The model the loading flags name (see :func:`add_model_loading`), with ``adapter``
    (``--adapter``) applied."""
    import torch

    from .. import loading

    dtype = getattr(torch, args.dtype) if args.dtype else None
    if args.random:
        if args.seed is not None:
            torch.manual_seed(args.seed)  # the random weights too: --seed makes runs identical
        model = api.build(args.source, device=args.device, dtype=dtype).eval()
        if args.quantize:
            from ..quant.layers import quantize_

            with torch.no_grad():
                quantize_(model, args.quantize)
        return model
    return loading.load(
        args.source, device=args.device, dtype=dtype, quantize=args.quantize, adapter=adapter
    )


def given_tokenizer(args: argparse.Namespace) -> Tokenizer | None:
    """The tokenizer ``--tokenizer`` names, or ``None``: the model's own."""
    return api.tokenizer(args.tokenizer) if args.tokenizer else None
