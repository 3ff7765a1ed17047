"""``zoo.load`` of a GGUF file: the model, its tokenizer and chat template from the metadata,
checked against a pinned sha256 as any weights file is."""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..files import BackgroundHash
from ..load import assembled, checked_target, quantized, to_hash

if TYPE_CHECKING:
    import torch

    from ...nn.base import ZooModel

__all__ = ["load_gguf"]


def load_gguf(
    path: str | os.PathLike[str],
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    strict: bool = True,
    verify: bool | None = None,
    tokenizer: bool = True,
    quantize: str | None = None,
    sha256: str | None = None,
    model_name: str | None = None,
) -> ZooModel:
    """Load the GGUF file ``path`` (see :func:`zoo.load` for the options).

    A GGUF file mixes types (norms in float32, weights quantized or in half precision): the
    model computes in ``dtype``, float32 unless given (as transformers reads GGUF), each
    quantized tensor dequantized as it is read. ``sha256`` (the Hub's, for a download) is
    checked as the model is built."""
    import torch

    from .read import read_gguf

    target = checked_target(device, dtype, quantize)
    dtype = dtype or torch.float32
    path = Path(path)
    hasher = None
    if sha256 and to_hash(path, sha256, verify):
        hasher = BackgroundHash({path: sha256}, what="the pinned sha256")
    try:
        checkpoint = read_gguf(path)
        model = assembled(
            checkpoint.architecture, checkpoint.config, checkpoint.state,
            target=target, dtype=dtype, strict=strict, unexpected=checkpoint.unexpected,
            what=str(path), model_name=model_name, quantize=quantize,
        )  # fmt: skip
    finally:
        if hasher is not None:
            hasher.verify()
    if hasher is not None:
        hasher.remember()
    checkpoint.state.clear()  # the model holds the tensors now: each float weight quantized
    quantized(model, quantize, target=target, dtype=dtype)  # below is freed as it goes
    if quantize is not None:
        _say_requantized(path, model, checkpoint.types, quantize)
    model.tokenizer, model.tokenizer_error = None, "loaded with tokenizer=False"
    if tokenizer:
        model.tokenizer, model.tokenizer_error = _tokenizer(path, checkpoint.metadata)
    return model


def _tokenizer(path: Path, metadata: Mapping[str, Any]) -> tuple[Any, str | None]:
    """The file's tokenizer, or ``None`` and why: one zoo cannot build (T5's unigram
    vocabulary, a damaged list) is a warning, and the model loads without it, as a
    checkpoint's named tokenizer does."""
    from ...errors import CheckpointError
    from .vocab import tokenizer_from_metadata

    try:
        found = tokenizer_from_metadata(metadata, where=str(path))
    except CheckpointError as exc:
        warnings.warn(f"{exc}; the model is loaded without a tokenizer", stacklevel=5)
        return None, str(exc)
    return found, None if found is not None else f"{path} holds no tokenizer"


def _say_requantized(path: Path, model: Any, types: Mapping[str, str], quantize: str) -> None:
    """Warn, naming the layers, when the file holds quantized tensors and ``quantize`` made
    layers that are not the file's own values (zoo's int8 has one scale per row where q8_0
    has one per 32 weights; a tied head is int8 in every mode; only q4_0 blocks are held
    as they are, by int4): those were dequantized and quantized again."""
    blocks = sorted({kind for kind in types.values() if kind not in ("f32", "f16", "bf16")})
    again = [name for name, m in model.named_modules() if getattr(m, "lossless", True) is False]
    if blocks and again:
        warnings.warn(
            f"{path} holds {', '.join(blocks)} blocks, but {len(again)} layer(s) of zoo's "
            f"{quantize!r} model were quantized again from their dequantized values (a second "
            f"rounding): {', '.join(again[:6])}{', ...' if len(again) > 6 else ''}. Load "
            "without quantize= to keep the file's values exactly (a q4_0 file's linear "
            "layers are held as they are by quantize='int4')",
            RuntimeWarning,
            stacklevel=5,  # the caller of zoo.load
        )
