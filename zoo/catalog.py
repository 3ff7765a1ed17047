"""The components that come with ``zoo.nn``, as data: one list, read by both sides.

``zoo.nn`` builds a model from it when no registry resolved the names
(:data:`zoo.nn.BUILTIN_COMPONENTS`, :data:`zoo.nn.blocks.BUILTIN_BLOCKS`); the registry
lists it as plugin ``zoo`` (:mod:`zoo.plugin.components`). It lives outside ``zoo.nn`` and
imports nothing, so listing the components imports no torch.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["BUILTIN", "Builtin"]


class Builtin(NamedTuple):
    """One built-in component.

    Args:
        kind: its kind (:data:`zoo.plugin.specs.COMPONENT_KINDS`).
        name: its name within the kind.
        factory: ``"module:function"`` inside ``zoo.nn`` (``"positions:rotary"`` is
            ``zoo.nn.positions.rotary``).
        description: one line for ``zoo info`` and ``zoo plugins``.
        reads: the config fields that are its options (``None``: not declared).
    """

    kind: str
    name: str
    factory: str
    description: str
    reads: tuple[str, ...] | None

    @property
    def reference(self) -> str:
        """The lazy ``"zoo.nn.module:function"`` reference to its factory."""
        return f"zoo.nn.{self.factory}"


#: Every built-in component, by kind: positions, norms, feed-forwards, attention, blocks.
BUILTIN: tuple[Builtin, ...] = (
    Builtin("positions", "learned", "positions:learned", "one trained vector per position", ()),
    Builtin("positions", "sinusoidal", "positions:sinusoidal", "fixed sin/cos vectors", ()),
    Builtin(
        "positions",
        "rotary",
        "positions:rotary",
        "RoPE on queries and keys (rotate-half, rope_theta, rotary_dim, rope_local_theta)",
        ("rope_theta", "rotary_dim", "rope_local_theta"),
    ),
    Builtin("positions", "none", "positions:none", "no position information", ()),
    Builtin(
        "norm",
        "layernorm",
        "norms:layernorm",
        "LayerNorm (layer_norm_eps, norm_bias)",
        ("layer_norm_eps", "norm_bias"),
    ),
    Builtin("norm", "rmsnorm", "norms:rmsnorm", "RMSNorm (layer_norm_eps)", ("layer_norm_eps",)),
    Builtin(
        "norm",
        "rmsnorm1p",
        "norms:rmsnorm1p",
        "RMSNorm scaled by 1 + weight, in float32 (Gemma; layer_norm_eps)",
        ("layer_norm_eps",),
    ),
    Builtin(
        "ffn",
        "mlp",
        "feedforward:mlp",
        "proj(act(fc(x))), act = activation (gelu, gelu_tanh, relu, silu)",
        ("activation", "mlp_bias"),
    ),
    Builtin("ffn", "swiglu", "feedforward:swiglu", "proj(silu(gate) * up)", ("mlp_bias",)),
    Builtin(
        "ffn", "geglu", "feedforward:geglu", "proj(gelu(gate) * up)", ("activation", "mlp_bias")
    ),
    Builtin(
        "attention",
        "mha",
        "attention:mha",
        "scaled dot-product attention; grouped-query with n_kv_heads, optional biases, "
        "attn_scale, attn_softcap",
        None,
    ),
    Builtin(
        "cross_attention",
        "mha",
        "attention:cross_mha",
        "attention over the encoder's output (n_kv_heads, biases)",
        (),
    ),
    Builtin(
        "block",
        "transformer",
        "blocks:transformer",
        "x + f(norm(x)) (pre-LN), norm(x + f(x)) (post-LN) or x + attn(norm1(x)) + "
        "ffn(norm2(x)) (parallel_residual)",
        ("norm_first", "parallel_residual"),
    ),
    Builtin(
        "block",
        "sandwich",
        "blocks:sandwich",
        "x + post_norm(f(pre_norm(x))): four norms per block (Gemma 2, Gemma 3)",
        (),
    ),
    Builtin(
        "block",
        "post_branch",
        "blocks:post_branch",
        "x + norm(f(x)): each branch normed inside the residual (OLMo-2)",
        (),
    ),
    Builtin(
        "block",
        "parallel_shared",
        "blocks:parallel_shared",
        "x + attn(norm(x)) + ffn(norm(x)): one norm for both branches (GPT-J, Cohere)",
        (),
    ),
)
