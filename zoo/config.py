"""Frozen, validated model configs.

Every architecture has one config class: a frozen dataclass deriving from :class:`ModelConfig`.
Field types are checked when the config is created, and each subclass adds its own range checks
in :meth:`ModelConfig.validate`. Configs are plain data: creating one never imports torch.

Field names are shared across architectures where the concept is shared: ``vocab_size``,
``context_length``, ``d_model``, ``n_heads``, ``n_layers`` (``n_encoder_layers`` /
``n_decoder_layers`` for encoder-decoders), ``d_ff`` and ``dropout``.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import operator
import typing
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal, TypeVar

from .errors import ConfigError
from .fields import check_fields

__all__ = [
    "MAX_LAYERS",
    "MAX_TOKENS",
    "MAX_WIDTH",
    "Activation",
    "DecoderConfig",
    "LayerType",
    "ModelConfig",
    "TransformerConfig",
    "meaning_of",
]

C = TypeVar("C", bound="ModelConfig")

Activation = Literal["gelu", "gelu_tanh", "relu", "silu"]

#: What one layer's self-attention sees, as transformers' ``layer_types`` spells it.
LayerType = Literal["full_attention", "sliding_attention"]

#: Upper bounds on sizes, far beyond any real model, so that a hostile or mistaken config
#: (``n_layers = 10**9``, ``context_length = 2**62``) is refused before anything is built.
MAX_LAYERS = 4096
MAX_TOKENS = 1 << 24  # vocab_size, context_length
MAX_WIDTH = 1 << 18  # d_model, d_ff


def meaning_of(config: Any, name: str, value: Any = dataclasses.MISSING) -> Any:
    """What field ``name`` (or ``value`` in its place) means in ``config``: its
    :meth:`ModelConfig.meaning`, or the value itself for a config of another kind."""
    meaning = getattr(config, "meaning", None)
    if meaning is None:
        return getattr(config, name, None) if value is dataclasses.MISSING else value
    return meaning(name, value)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Base class of architecture configs.

    Subclasses are ``@dataclasses.dataclass(frozen=True)``, set the class variable
    ``architecture`` to the architecture name, and extend :meth:`validate`.
    """

    architecture: ClassVar[str] = ""

    def __post_init__(self) -> None:
        check_fields(self)  # types, by annotation (zoo.fields)
        self.validate()

    def validate(self) -> None:
        """Raise :class:`~zoo.errors.ConfigError` naming the field when a value is out of range."""

    # -- helpers for subclasses -------------------------------------------------------------
    def _require(self, condition: bool, name: str, why: str) -> None:
        if not condition:
            raise ConfigError(f"{type(self).__name__}.{name} = {getattr(self, name)!r}: {why}")

    def _require_positive(self, *names: str) -> None:
        for name in names:
            self._require(getattr(self, name) > 0, name, "must be a positive integer")

    def _require_at_most(self, bound: int, *names: str) -> None:
        """Sizes beyond any real model are refused before anything is allocated (a hostile
        config.json asking for 10**9 layers or a 2**62 context must not exhaust memory)."""
        for name in names:
            self._require(getattr(self, name) <= bound, name, f"must be at most {bound:,}")

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def upgrade(cls, values: Mapping[str, Any]) -> Mapping[str, Any]:
        """``values`` as written by an older zoo, in today's fields (:meth:`from_dict` calls
        it first); subclasses that renamed a field map the old spelling here."""
        return values

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The names of the config fields, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def _check_names(cls, names: typing.Iterable[str]) -> None:
        valid = cls.field_names()
        for name in names:
            if name not in valid:
                close = difflib.get_close_matches(name, valid, n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise ConfigError(
                    f"{cls.__name__} has no field {name!r}.{hint} Valid fields: {', '.join(valid)}."
                )

    @classmethod
    def from_dict(cls: type[C], values: Mapping[str, Any]) -> C:
        """Create a config from a mapping, refusing unknown and reporting missing fields."""
        values = cls.upgrade(values)
        cls._check_names(values)
        missing = [
            f.name
            for f in dataclasses.fields(cls)
            if f.name not in values
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        ]
        if missing:
            raise ConfigError(f"{cls.__name__} is missing required field(s): {', '.join(missing)}")
        return cls(**values)

    #: Pairs of fields that say one thing two ways (at most one of each pair is set): an
    #: override of one supersedes the other's value, so either can be overridden on its own.
    ALTERNATIVES: typing.ClassVar[tuple[tuple[str, str], ...]] = ()

    @classmethod
    def overridden(cls, values: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
        """``values`` with ``overrides`` applied: overriding one field of an
        :data:`ALTERNATIVES` pair, and not the other, clears the other."""
        superseded = {
            other: None
            for pair in cls.ALTERNATIVES
            for field, other in (pair, pair[::-1])
            if field in overrides and other not in overrides
        }
        return {**values, **superseded, **overrides}

    def replace(self: C, **overrides: Any) -> C:
        """Return a copy with ``overrides`` applied (validated like a new config)."""
        self._check_names(overrides)
        return dataclasses.replace(self, **self.overridden({}, overrides))

    def to_dict(self) -> dict[str, Any]:
        """The config as a JSON-compatible dict of its fields."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    #: Fields whose ``None`` stands for a value derived from the rest of the config
    #: (``norm_bias = None`` means ``bias``): the value each means, by :meth:`meaning`.
    FOLLOWS: typing.ClassVar[Mapping[str, Callable[[Any], Any]]] = {}

    def meaning(self, name: str, value: Any = dataclasses.MISSING) -> Any:
        """What field ``name`` means in this config: its value (or ``value`` in its place),
        a ``None`` spelled out by :data:`FOLLOWS` (two spellings of one model compare equal:
        ``norm_bias = None`` with ``bias = False`` means ``norm_bias = False``)."""
        value = getattr(self, name, None) if value is dataclasses.MISSING else value
        follows = self.FOLLOWS.get(name)
        return follows(self) if value is None and follows is not None else value


@dataclasses.dataclass(frozen=True, kw_only=True)
class TransformerConfig(ModelConfig):
    """Fields shared by every Transformer in zoo (subclasses add the layer counts).

    A Transformer is a composition: ``positions``, ``norm``, ``ffn`` and ``attention`` name
    registered components (``zoo plugins`` lists them; a plugin adds new ones through the
    ``zoo_components`` hook), and the other fields are their options. A config is data: the
    names are resolved when a model is built (``zoo.build``: an unknown one is a
    :class:`~zoo.errors.ConfigError` naming the field).

    Args:
        vocab_size: number of token ids.
        context_length: longest sequence the model accepts.
        d_model: width of the residual stream.
        n_heads: attention (query) heads; must divide ``d_model`` unless ``head_dim`` is set.
        d_ff: hidden width of the feed-forward network (of each branch of a gated one).
        dropout: dropout on embeddings, attention weights and residual branches (training only).
        norm_first: pre-LN (``x + f(ln(x))``) when true, post-LN (``ln(x + f(x))``) when false.
        parallel_residual: attention and feed-forward read the same input and add to it
            together, ``x + attn(ln1(x)) + ffn(ln2(x))`` (GPT-J, GPT-NeoX); pre-LN only.
        final_norm: apply a norm after the last layer (of each stack).
        activation: activation of the ``mlp`` feed-forward: ``gelu`` (erf), ``gelu_tanh``,
            ``relu`` or ``silu``.
        positions: position scheme component: ``learned``, ``sinusoidal``, ``rotary``,
            ``none``, or one a plugin supplies.
        tie_embeddings: the LM head shares its weight with the token embedding.
        head_bias: the LM head has a bias (only without tying).
        scale_embeddings: multiply token embeddings by ``sqrt(d_model)`` (Vaswani et al.).
        layer_norm_eps: the norms' epsilon.
        norm: norm component: ``layernorm``, ``rmsnorm``, or one a plugin supplies.
        ffn: feed-forward component: ``mlp``, ``swiglu``, ``geglu``, or one a plugin supplies.
        attention: self-attention component: ``mha``, or one a plugin supplies.
        n_kv_heads: key/value heads (``None``: ``n_heads``); fewer is grouped-query
            attention, 1 multi-query. Must divide ``n_heads``.
        bias: the linear layers inside the blocks (and LayerNorms) have biases.
        qkv_bias: the query/key/value projections have biases (``None``: ``bias``).
        rope_theta: base of the rotary angles.
        sliding_window: each query sees at most this many most recent keys (``None``: all).
        head_dim: features per attention head (``None``: ``d_model / n_heads``). Set apart
            (Qwen3, Gemma), queries are ``n_heads * head_dim`` wide and the output projection
            maps that width back to ``d_model``; :attr:`head_size` is the value in effect.
        qk_norm: normalise each head's queries and keys (the ``norm`` component over
            ``head_size`` features) before rotary positions (Qwen3, Gemma 3).
        n_experts: a mixture of this many ``ffn`` experts replaces the one feed-forward of
            every block, with a router choosing ``experts_per_token`` of them per token
            (Mixtral); ``None``: one dense feed-forward.
        experts_per_token: experts each token is routed to (with ``n_experts``).
        block: block component each layer is built from: ``transformer`` (the norm placement
            ``norm_first``/``parallel_residual`` say), ``sandwich`` (a norm before and after
            each branch: Gemma 2/3), ``post_branch`` (a norm after each branch, inside the
            residual: OLMo-2), ``parallel_shared`` (one norm feeding attention and
            feed-forward side by side: GPT-J, Cohere), or one a plugin supplies.
        layer_types: per layer, ``"full_attention"`` or ``"sliding_attention"`` (as
            transformers writes it); sliding layers see ``sliding_window`` keys, full ones
            every key. ``None``: every layer is sliding when ``sliding_window`` is set. An
            explicit list is never resized: a change of the layer count must list them anew.
        layer_pattern: the kinds of a repeating run of layers, as ``layer_types`` spells them:
            layer ``i`` is ``layer_pattern[i % len(layer_pattern)]`` (Gemma 2 alternates
            ``("sliding_attention", "full_attention")``; Gemma 3 has five sliding layers then
            one full), so the layer count can change. Not with ``layer_types``.
        rope_local_theta: rotary base of the sliding layers (Gemma 3); ``None``: ``rope_theta``.
        rotary_dim: features of each head that rotary positions turn, an even count up to
            ``head_size`` (partial rotary: GPT-J, GPT-NeoX, Phi); ``None``: all of them.
        attn_scale: the factor on attention scores (``None``: ``head_size ** -0.5``; Gemma
            uses ``query_pre_attn_scalar ** -0.5``).
        attn_softcap: attention scores become ``cap * tanh(score / cap)`` before the mask
            and softmax (Gemma 2); ``None``: no cap.
        final_softcap: the logits become ``cap * tanh(logits / cap)`` (Gemma 2); ``None``: no cap.
        logit_scale: the logits are multiplied by this (Cohere).
        attn_out_bias: the attention output projection has a bias (``None``: ``bias``).
        mlp_bias: the feed-forward's linear layers have biases (``None``: ``bias``).
        norm_bias: LayerNorms have a bias (``None``: ``bias``).
        qk_norm_scope: with ``qk_norm``, ``"head"`` normalises each head's features
            (Qwen3, Gemma 3), ``"full"`` all heads' queries (and keys) together, over
            ``n_heads * head_size`` features (OLMo-2).
    """

    vocab_size: int
    context_length: int
    d_model: int
    n_heads: int
    d_ff: int
    dropout: float = 0.0
    norm_first: bool = True
    parallel_residual: bool = False
    final_norm: bool = True
    activation: Activation = "gelu"
    positions: str = "learned"
    tie_embeddings: bool = True
    head_bias: bool = False
    scale_embeddings: bool = False
    layer_norm_eps: float = 1e-5
    norm: str = "layernorm"
    ffn: str = "mlp"
    attention: str = "mha"
    n_kv_heads: int | None = None
    bias: bool = True
    qkv_bias: bool | None = None
    rope_theta: float = 10000.0
    sliding_window: int | None = None
    head_dim: int | None = None
    qk_norm: bool = False
    n_experts: int | None = None
    experts_per_token: int = 2
    block: str = "transformer"
    ALTERNATIVES = (("layer_types", "layer_pattern"),)
    layer_types: tuple[LayerType, ...] | None = None
    layer_pattern: tuple[LayerType, ...] | None = None
    rope_local_theta: float | None = None
    rotary_dim: int | None = None
    attn_scale: float | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None
    logit_scale: float = 1.0
    attn_out_bias: bool | None = None
    mlp_bias: bool | None = None
    norm_bias: bool | None = None
    qk_norm_scope: Literal["head", "full"] = "head"

    @classmethod
    def upgrade(cls, values: Mapping[str, Any]) -> dict[str, Any]:
        """Checkpoints saved before ``rotary_dim`` stored ``rotary_fraction``: it becomes
        the count those models turned (``int(head_size * fraction)``, rounded down to even)."""
        values = dict(values)
        if "rotary_fraction" in values and "rotary_fraction" not in cls.field_names():
            fraction = values.pop("rotary_fraction")
            if values.get("rotary_dim") is None and fraction != 1:
                if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
                    raise ConfigError(f"rotary_fraction = {fraction!r} must be a number")
                heads, width = values.get("n_heads"), values.get("d_model")
                head = values.get("head_dim") or 0
                if not head and isinstance(width, int) and isinstance(heads, int) and heads > 0:
                    head = width // heads
                values["rotary_dim"] = int(head * fraction) // 2 * 2
        return values

    FOLLOWS: ClassVar[Mapping[str, Callable[[Any], Any]]] = {
        "n_kv_heads": operator.attrgetter("n_heads"),
        "head_dim": lambda c: c.d_model // c.n_heads,
        "qkv_bias": operator.attrgetter("bias"),
        "attn_out_bias": operator.attrgetter("bias"),
        "mlp_bias": operator.attrgetter("bias"),
        "norm_bias": operator.attrgetter("bias"),
        "rope_local_theta": operator.attrgetter("rope_theta"),
        "rotary_dim": operator.attrgetter("head_size"),
        "attn_scale": lambda c: c.head_size**-0.5,
    }

    @property
    def head_size(self) -> int:
        """Features per attention head: ``head_dim``, else ``d_model / n_heads``."""
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    def validate(self) -> None:
        self._require_positive("vocab_size", "context_length", "d_model", "n_heads", "d_ff")
        self._require_at_most(MAX_TOKENS, "vocab_size", "context_length")
        self._require_at_most(MAX_WIDTH, "d_model", "d_ff")
        if self.head_dim is None:
            self._require(
                self.d_model % self.n_heads == 0,
                "d_model",
                f"must be divisible by n_heads = {self.n_heads} (or set head_dim)",
            )
        else:
            self._require(
                0 < self.head_dim <= MAX_WIDTH,
                "head_dim",
                f"must be a positive integer at most {MAX_WIDTH:,}",
            )
        if self.n_experts is not None:
            self._require(0 < self.n_experts <= 1024, "n_experts", "must be in [1, 1024]")
            self._require(
                0 < self.experts_per_token <= self.n_experts,
                "experts_per_token",
                f"must be in [1, n_experts = {self.n_experts}]",
            )
        self._require(0.0 <= self.dropout < 1.0, "dropout", "must be in [0, 1)")
        self._require(
            self.norm_first or not self.parallel_residual,
            "parallel_residual",
            "a parallel residual is pre-LN: set norm_first=True",
        )
        self._require(self.layer_norm_eps > 0, "layer_norm_eps", "must be positive")
        self._require(
            not (self.tie_embeddings and self.head_bias),
            "head_bias",
            "a tied LM head has no bias; set tie_embeddings=False to use one",
        )
        if self.n_kv_heads is not None:
            self._require(
                0 < self.n_kv_heads <= self.n_heads and self.n_heads % self.n_kv_heads == 0,
                "n_kv_heads",
                f"must divide n_heads = {self.n_heads}",
            )
        self._require(self.rope_theta > 0, "rope_theta", "must be positive")
        if self.rotary_dim is not None:
            self._require(
                0 < self.rotary_dim <= self.head_size and self.rotary_dim % 2 == 0,
                "rotary_dim",
                f"must be an even count in [2, head_size = {self.head_size}]",
            )
        if self.sliding_window is not None:
            self._require(self.sliding_window > 0, "sliding_window", "must be positive")
        if self.rope_local_theta is not None:
            self._require(self.rope_local_theta > 0, "rope_local_theta", "must be positive")
        for name in ("attn_scale", "attn_softcap", "final_softcap"):
            if getattr(self, name) is not None:
                self._require(getattr(self, name) > 0, name, "must be positive (or None)")
        self._require(self.logit_scale != 0, "logit_scale", "must not be 0")
        self._require(bool(self.block), "block", "must name a block component")
        self._check_layer_pattern()

    def _check_layer_pattern(self) -> None:
        pattern = self.layer_pattern
        if pattern is None:
            return
        self._require(
            self.layer_types is None,
            "layer_pattern",
            "give either layer_pattern (a repeating run) or layer_types (one kind per "
            "layer), not both: set the other to None",
        )
        self._require(
            0 < len(pattern) <= MAX_LAYERS,
            "layer_pattern",
            f"must name 1 to {MAX_LAYERS:,} layer kinds (or be None)",
        )
        self._require(
            self.sliding_window is not None or "sliding_attention" not in pattern,
            "layer_pattern",
            "names sliding layers: set sliding_window",
        )

    def layer_type(self, layer: int) -> LayerType:
        """What layer ``layer``'s self-attention sees: ``layer_types[layer]``, else
        ``layer_pattern`` repeated, else sliding for every layer when ``sliding_window`` is
        set."""
        if self.layer_types is not None:
            return self.layer_types[layer]
        if self.layer_pattern is not None:
            return self.layer_pattern[layer % len(self.layer_pattern)]
        return "full_attention" if self.sliding_window is None else "sliding_attention"

    def layer_window(self, layer: int) -> int | None:
        """The keys layer ``layer`` sees back from each query (``None``: all)."""
        return self.sliding_window if self.layer_type(layer) == "sliding_attention" else None

    def layer_rope_theta(self, layer: int) -> float:
        """The rotary base of layer ``layer``: ``rope_local_theta`` on sliding layers when set."""
        if self.rope_local_theta is not None and self.layer_type(layer) == "sliding_attention":
            return self.rope_local_theta
        return self.rope_theta


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecoderConfig(TransformerConfig):
    """Config of a decoder-only language model (:class:`zoo.nn.DecoderLM`).

    Args:
        n_layers: number of blocks; the other fields are those of :class:`TransformerConfig`.
        embedding_multiplier: the token vectors are multiplied by this, after
            ``scale_embeddings``' sqrt(d_model) and before the position vectors (Granite).
        embedding_norm: a norm (the ``norm`` component) after the embedding, before the
            first block (BLOOM's ``word_embeddings_layernorm``); key ``emb_norm``.
        embedding: an ``embedding`` component (a plugin's: ``(B, T, d_model) -> (B, T,
            d_model)``) applied last, between the embedding and the first block; key
            ``post_embedding``. ``None``: none.
        head: a ``head`` component (a plugin's: logits ``(B, T, vocab) -> (B, T, vocab)``)
            applied after ``logit_scale`` and ``final_softcap``; key ``post_head``.
            ``None``: none.
    """

    n_layers: int
    embedding_multiplier: float = 1.0
    embedding_norm: bool = False
    embedding: str | None = None
    head: str | None = None

    def validate(self) -> None:
        super().validate()
        self._require_positive("n_layers")
        self._require_at_most(MAX_LAYERS, "n_layers")
        self._require(
            math.isfinite(self.embedding_multiplier) and self.embedding_multiplier != 0,
            "embedding_multiplier",
            "must be a finite, non-zero number",
        )
        if self.layer_types is not None:
            count = len(self.layer_types)
            if count != self.n_layers:
                raise ConfigError(
                    f"{type(self).__name__}.layer_types lists {count} layers but n_layers = "
                    f"{self.n_layers}: an explicit list is not resized. Give one kind per "
                    "layer, or a repeating layer_pattern (e.g. layer_pattern=('sliding_attention', "
                    "'full_attention'), layer_types=None) to change the layer count"
                )
            self._require(
                self.sliding_window is not None or "sliding_attention" not in self.layer_types,
                "layer_types",
                "names sliding layers: set sliding_window",
            )
