"""Base class of zoo models and the input checks every forward pass makes."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor, nn

from ..config import ModelConfig
from .norms import RMSNorm, UnitOffsetRMSNorm
from .positions import PositionScheme

if TYPE_CHECKING:
    from ..checkpoint.report import LoadReport
    from ..tokenizers import Tokenizer

__all__ = [
    "ZooModel",
    "activation_dtype",
    "check_padding_mask",
    "check_position_ids",
    "check_token_ids",
    "chosen_on_host",
    "embed_tokens",
    "init_weights",
    "random_ids",
    "right_padding",
]


class ZooModel(nn.Module):
    """A model built by zoo: carries its frozen ``config`` and the ``name`` it was built from.

    What an architecture's model class must provide (the conformance kit checks each):

    - subclass ``ZooModel`` and take the config as the first constructor argument; zoo
      builds it as ``cls(config, parts=parts)`` when the constructor takes ``parts`` (the
      registry's components, :class:`~zoo.nn.Parts`), else as ``cls(config)``;
    - a config with ``vocab_size`` and ``context_length``;
    - ``forward(input_ids, attention_mask=None)`` returning logits ``(B, T, vocab_size)``
      (an encoder-decoder: ``forward(src_ids, tgt_ids, src_mask=None, tgt_mask=None)``, with
      ``is_encoder_decoder = True``), raising ``ValueError`` on bad input;
    - :meth:`example_inputs`, valid keyword inputs for ``forward``.

    Optional: a method ``start_decoding(input_ids, keep, max_new_tokens, *, start_id=None)``
    returning a cached :class:`~zoo.runtime.session.DecodingSession` (an encoder-decoder must
    have one); :func:`zoo.runtime.start_decoding` calls it, and without one decodes a
    :class:`~zoo.nn.DecoderLM` over a KV cache and any other decoder by recomputing the whole
    sequence per token.
    """

    config: ModelConfig
    #: Whether the model reads a source and generates a separate target (the prompt of
    #: ``zoo.generate`` is then the source, and the output starts with a start token).
    is_encoder_decoder: ClassVar[bool] = False
    #: Whether every module of the model initialises its tensors in ``reset_parameters()``
    #: (``reset_buffers()``) at the end of its ``__init__`` and nowhere else, ties last: then
    #: :func:`zoo.build` makes the model it sized on ``meta`` real (:mod:`zoo.nn.materialize`)
    #: instead of constructing it a second time. Leave it ``False`` when unsure.
    replayable_init: ClassVar[bool] = False

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        #: The named model this instance was built from (``None`` when built from a config).
        self.name: str | None = None
        #: The tokenizer :func:`zoo.load` attached (``None`` after :func:`zoo.build`).
        self.tokenizer: Tokenizer | None = None
        #: Why :func:`zoo.load` attached no tokenizer (``None`` when it did, or after build).
        self.tokenizer_error: str | None = None
        #: What :func:`zoo.load` found in the checkpoint (``None`` after :func:`zoo.build`).
        self.load_report: LoadReport | None = None
        #: The linear layers :func:`zoo.build` / :func:`zoo.load` turned into
        #: :class:`~zoo.nn.linear.OneDNNLinear` (oneDNN's CPU kernels, same weights): a
        #: load-time transform, empty with ``onednn=False`` or off the CPU.
        self.onednn_linears: tuple[str, ...] = ()

    def example_inputs(
        self, batch_size: int = 2, seq_len: int = 8, *, generator: torch.Generator | None = None
    ) -> dict[str, Tensor]:
        """Valid keyword inputs for ``forward`` on this model's device (random ids, with some
        padding), used by the conformance kit. Every model must provide it."""
        raise NotImplementedError(f"{type(self).__name__} must implement example_inputs()")

    def num_parameters(self) -> int:
        """Number of distinct parameters (a tied weight counts once)."""
        return sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())

    def extra_repr(self) -> str:
        parts = [f"name={self.name!r}"] if self.name else []
        if self.onednn_linears:
            parts.append(
                f"onednn={len(self.onednn_linears)} linears (oneDNN's CPU kernels; "
                "build or load with onednn=False for PyTorch's)"
            )
        return ", ".join(parts)


def chosen_on_host(model: nn.Module) -> bool:
    """Whether a module of ``model`` computes what the host decides before each step (a class
    attribute ``host_chosen = True``: a LoRA bank, whose rows' adapters are picked per step),
    which a step recorded as a CUDA graph or compiled once would freeze."""
    return any(getattr(m, "host_chosen", False) for m in model.modules())


def activation_dtype(module: nn.Module) -> tuple[torch.dtype, torch.device]:
    """The dtype activations run in (that of the first floating-point parameter or buffer: a
    weight-only quantized model keeps float norms and scales) and the module's device."""
    tensors = [*module.parameters(), *module.buffers()]
    floating = next((t for t in tensors if t.is_floating_point()), None)
    if floating is not None:
        return floating.dtype, floating.device
    return torch.float32, tensors[0].device if tensors else torch.device("cpu")


def random_ids(
    shape: tuple[int, ...],
    vocab_size: int,
    device: torch.device,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Random token ids drawn on the CPU (reproducible with ``generator``), moved to
    ``device``; on ``meta`` an uninitialised tensor of the same shape."""
    if device.type == "meta":
        return torch.empty(shape, dtype=torch.long, device=device)
    return torch.randint(0, vocab_size, shape, generator=generator).to(device)


def right_padding(batch_size: int, seq_len: int, device: torch.device) -> Tensor:
    """A ``(B, L)`` padding mask whose last row is padded on the right (half its length)."""
    mask = torch.ones(batch_size, seq_len, dtype=torch.long, device=device)
    if batch_size > 1 and seq_len > 1 and device.type != "meta":
        mask[-1, (seq_len + 1) // 2 :] = 0
    return mask


def embed_tokens(
    tok_emb: nn.Embedding,
    pos_emb: nn.Module,
    drop: nn.Module,
    ids: Tensor,
    positions: Tensor,
    *,
    scale_by_width: bool,
    multiplier: float = 1.0,
) -> Tensor:
    """Token plus position vectors, ``(B, L) -> (B, L, d_model)``: ``drop(tok_emb(ids) +
    pos_emb(positions))``, the token part scaled by ``sqrt(d_model)`` when ``scale_by_width``
    (Vaswani et al., Gemma), rounded to the activations' dtype first (transformers' Gemma: in
    bfloat16 ``sqrt(3584)`` is 59.75), then by ``multiplier`` (Granite). A
    :class:`~zoo.nn.PositionScheme` that adds no vectors (rotary, none) adds nothing."""
    x = tok_emb(ids)  # (B, L, d_model)
    if scale_by_width:  # by sqrt(d) rounded to the activations' dtype, as transformers does
        x = x * x.new_tensor(math.sqrt(x.shape[-1]))
    if multiplier != 1.0:
        x = x * multiplier
    vectors = (
        pos_emb.embed(positions) if isinstance(pos_emb, PositionScheme) else pos_emb(positions)
    )
    return drop(x if vectors is None else x + vectors.to(x.dtype))


def init_weights(module: nn.Module, *, std: float = 0.02) -> None:
    """GPT-style initialisation: normal(0, std) weights, zero biases, unit norms."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        bias = getattr(module, "bias", None)
        if bias is not None:
            nn.init.zeros_(bias)
    elif isinstance(module, UnitOffsetRMSNorm):
        nn.init.zeros_(module.weight)  # scale 1 + 0
    elif isinstance(module, (nn.LayerNorm, RMSNorm)):
        nn.init.ones_(module.weight)
        bias = getattr(module, "bias", None)
        if bias is not None:
            nn.init.zeros_(bias)


def check_token_ids(
    ids: Any, *, vocab_size: int, context_length: int, name: str = "input_ids"
) -> Tensor:
    """Validate a ``(B, T)`` integer tensor of token ids; raise ``ValueError`` saying what is
    wrong and what is allowed."""
    if not isinstance(ids, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of token ids, got {type(ids).__name__}")
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer token ids (torch.long), got dtype {ids.dtype}")
    if ids.ndim != 2:
        raise ValueError(
            f"{name} must have shape (batch, seq_len): a 2-D tensor of token ids (torch.long); "
            f"got a {ids.ndim}-D tensor of shape {tuple(ids.shape)}. {_rank_hint(ids.ndim, name)}"
        )
    if ids.shape[1] == 0:
        raise ValueError(f"{name} is empty (seq_len 0); give at least one token")
    if ids.shape[1] > context_length:
        raise ValueError(
            f"{name} has {ids.shape[1]} tokens but the context length is {context_length}; "
            "truncate the input"
        )
    if ids.device.type != "meta" and ids.numel():
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise ValueError(f"{name} holds id {bad}, outside the vocabulary [0, {vocab_size})")
    return ids.long()


def _rank_hint(ndim: int, name: str) -> str:
    """What to do with ids of rank ``ndim`` instead of 2."""
    if ndim == 0:
        return f"Give a sequence: {name} = torch.tensor([[id, ...]])"
    if ndim == 1:
        return f"Add the batch dimension: {name}.unsqueeze(0) (one sequence)"
    return (
        "Pass token ids, not embeddings or one-hot vectors (one-hot rows: "
        f"{name}.argmax(-1)); sequences nested in more dimensions: "
        f"{name}.reshape(-1, {name}.shape[-1])"
    )


def check_position_ids(positions: Any, shape: tuple[int, ...], context_length: int) -> Tensor:
    """Validate position ids: an integer tensor of ``shape`` (one per token) with values in
    ``[0, context_length)``; raise ``ValueError`` saying what is wrong."""
    if not isinstance(positions, Tensor):
        raise ValueError(f"position_ids must be a torch.Tensor, got {type(positions).__name__}")
    if (
        positions.dtype.is_floating_point
        or positions.dtype.is_complex
        or positions.dtype == torch.bool
    ):
        raise ValueError(f"position_ids must hold integers (torch.long), got {positions.dtype}")
    if tuple(positions.shape) != tuple(shape):
        raise ValueError(
            f"position_ids has shape {tuple(positions.shape)} but the ids have {tuple(shape)}; "
            "give one position per token"
        )
    if positions.device.type != "meta" and positions.numel():
        low, high = int(positions.min()), int(positions.max())
        if low < 0 or high >= context_length:
            bad = low if low < 0 else high
            raise ValueError(f"position_ids holds {bad}, outside the context [0, {context_length})")
    return positions.long()


def check_padding_mask(
    mask: Any, shape: tuple[int, ...], *, name: str = "attention_mask"
) -> Tensor | None:
    """Validate a ``(B, L)`` padding mask of the given ``shape`` (1/True = token,
    0/False = padding) and return it as bool, or ``None`` when there is no padding."""
    if mask is None:
        return None
    if not isinstance(mask, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(mask).__name__}")
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(
            f"{name} has shape {tuple(mask.shape)} but must have shape {tuple(shape)} "
            "(one entry per token: 1 for tokens, 0 for padding)"
        )
    if mask.dtype != torch.bool:
        if mask.dtype.is_floating_point or mask.dtype.is_complex:
            raise ValueError(f"{name} must be bool or integer 0/1, got dtype {mask.dtype}")
        if mask.device.type != "meta" and bool(((mask != 0) & (mask != 1)).any()):
            raise ValueError(f"{name} must hold only 0 (padding) and 1 (token)")
        mask = mask.bool()
    if mask.device.type != "meta" and bool(mask.all()):
        return None
    return mask
